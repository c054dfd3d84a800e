//! Black-box tests of `Config::parse`: the example file, defaults, secrets, and one test per
//! kind of error with its exact one-line message.

use std::time::Duration;

use opledger_config::{
    BotMode, Config, ConfigError, ExposeSecret, ReplyPlaceholder, StorageBackend, StorageUrl,
};

const TOKEN: &str = "123456:CANARY-token-value_xyz";
const WEBHOOK_SECRET: &str = "canary_webhook-secret";
const ADMIN_TOKEN: &str = "CANARY-admin-token-0123456789abcdef";
const CLIENT_TOKEN: &str = "CANARY-client-token-0123456789abcdef";

/// The environment the tests run with: only the variables they name.
fn env(name: &str) -> Option<String> {
    match name {
        "SHOP_BOT_TOKEN" | "OTHER_BOT_TOKEN" | "CRM_BOT_TOKEN" => Some(TOKEN.to_owned()),
        "SHOP_WEBHOOK_SECRET" | "CRM_WEBHOOK_SECRET" => Some(WEBHOOK_SECRET.to_owned()),
        "CRM_UPSTREAM_SECRET" => Some("canary_upstream-secret".to_owned()),
        "OPLEDGER_ADMIN_TOKEN" | "SAME_AS_ADMIN" => Some(ADMIN_TOKEN.to_owned()),
        "SHOP_API_TOKEN" | "SHOP_API_TOKEN_AGAIN" => Some(CLIENT_TOKEN.to_owned()),
        "OTHER_API_TOKEN" => Some("CANARY-other-client-0123456789".to_owned()),
        "SHORT_TOKEN" => Some("only-15-letters".to_owned()),
        "SPACED_TOKEN" => Some("an admin token with spaces".to_owned()),
        "EMPTY_VAR" => Some(String::new()),
        "BAD_SECRET" => Some("has spaces and !".to_owned()),
        _ => None,
    }
}

const BOT: &str = r#"
[[bots]]
name = "shop"
token_env = "SHOP_BOT_TOKEN"
webhook_secret_env = "SHOP_WEBHOOK_SECRET"
"#;

const ACTION: &str = r#"
[[actions]]
name = "coupon"
bot = "shop"
command = "coupon"
params = ["campaign"]
key = "{campaign}:{user_id}"
"#;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, &env)
}

/// The one-line message of the error `text` produces.
fn error(text: &str) -> String {
    let message = parse(text)
        .expect_err("the config must be refused")
        .to_string();
    assert!(!message.contains('\n'), "one line: {message}");
    message
}

#[test]
fn example_file_parses_with_its_variables_set() {
    let config = parse(include_str!("../../../opledger.example.toml")).unwrap();
    assert_eq!(config.storage.url.backend(), StorageBackend::Sqlite);
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(
        config.server.dedup_retention,
        Duration::from_secs(72 * 3600)
    );
    assert_eq!(config.bots.len(), 2, "shop, and crm behind a gateway");
    let bot = &config.bots[0];
    assert_eq!(bot.mode, BotMode::Webhook);
    assert_eq!(bot.token.expose_secret(), TOKEN);
    assert_eq!(
        bot.webhook_secret.as_ref().map(|s| s.expose_secret()),
        Some(WEBHOOK_SECRET)
    );
    assert_eq!(bot.api_base_url, "https://api.telegram.org");
    assert_eq!(config.actions.len(), 3);
    let coupon = config.action_for_command("shop", "coupon").unwrap();
    assert_eq!(coupon.repeat_window, None);
    let callme = config.action_for_command("shop", "callme").unwrap();
    assert_eq!(callme.repeat_window, Some(Duration::from_secs(600)));
    assert!(callme.params.is_empty());
    let effector = coupon.effector.as_ref().unwrap();
    assert_eq!(
        effector
            .lookup_url
            .as_ref()
            .unwrap()
            .render("7c0a2f56-0000-5000-8000-000000000001")
            .unwrap()
            .as_str(),
        "http://127.0.0.1:9000/coupons/by-reference/7c0a2f56-0000-5000-8000-000000000001"
    );
    assert_eq!(
        coupon.reply.confirmed.placeholders().collect::<Vec<_>>(),
        [
            ReplyPlaceholder::Param("campaign"),
            ReplyPlaceholder::Result("code")
        ]
    );
    let signup = config.action("signup").unwrap();
    assert_eq!(signup.repeat_window, None);
    assert!(signup.effector.as_ref().unwrap().honours_idempotency_key);
    assert_eq!(
        config.api.admin_token_env.as_deref(),
        Some("OPLEDGER_ADMIN_TOKEN")
    );
    assert_eq!(
        config.api.admin_token.as_ref().map(|t| t.expose_secret()),
        Some(ADMIN_TOKEN)
    );
}

#[test]
fn example_file_uses_every_key() {
    let example = include_str!("../../../opledger.example.toml");
    let keys = [
        "url",
        "listen",
        "body_limit_bytes",
        "request_timeout_ms",
        "shutdown_grace_ms",
        "dedup_retention_hours",
        "store_raw_updates",
        "connection_limit",
        "header_read_timeout_ms",
        "idle_timeout_ms",
        "admin_token_env",
        "name",
        "token_env",
        "webhook_secret_env",
        "api_base_url",
        "mode",
        "poll_timeout_secs",
        "max_connections",
        "bot",
        "command",
        "params",
        "key",
        "repeat_window_secs",
        "confirm",
        "confirm_expiry_secs",
        "timeout_ms",
        "honours_idempotency_key",
        "lookup_url",
        "max_attempts",
        "confirmed",
        "failed",
        "secret_env",
        "updates",
        "give_up_after_secs",
    ];
    for key in keys {
        assert!(
            example.contains(&format!("\n{key} = ")),
            "the example shows `{key}`"
        );
    }
}

#[test]
fn no_file_means_the_defaults() {
    let config = Config::default();
    assert_eq!(config.storage.url.expose_secret(), "sqlite://opledger.db");
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.server.body_limit_bytes, 1024 * 1024);
    assert_eq!(config.server.request_timeout, Duration::from_secs(10));
    assert_eq!(config.server.shutdown_grace, Duration::from_secs(10));
    assert_eq!(
        config.server.dedup_retention,
        Duration::from_secs(72 * 3600)
    );
    assert!(!config.server.store_raw_updates);
    assert_eq!(config.server.connection_limit, 512);
    assert_eq!(config.server.header_read_timeout, Duration::from_secs(10));
    assert_eq!(config.server.idle_timeout, Duration::from_secs(60));
    assert!(config.api.admin_token.is_none(), "the read API is off");
    assert!(config.bots.is_empty() && config.actions.is_empty());
    // An empty file is the same as no file.
    assert_eq!(format!("{:?}", parse("").unwrap()), format!("{config:?}"));
}

#[test]
fn omitted_keys_take_their_defaults() {
    let config = parse(&format!("{BOT}{ACTION}")).unwrap();
    let bot = &config.bots[0];
    assert_eq!(bot.api_base_url, "https://api.telegram.org");
    assert_eq!(bot.mode, BotMode::Webhook);
    assert_eq!(bot.poll_timeout, Duration::from_secs(30));
    assert_eq!(bot.max_connections, 40);
    let action = &config.actions[0];
    assert_eq!(action.repeat_window, None);
    assert_eq!(action.confirm, None, "no confirmation unless asked for");
    assert!(action.effector.is_none());
    assert_eq!(action.reply.confirmed.as_str(), "Done.");
    assert_eq!(
        action.reply.failed.as_str(),
        "Sorry, that did not work: {error}"
    );

    let effector = parse(&format!(
        "{BOT}{ACTION}[actions.effector]\nurl = \"http://127.0.0.1:9000/x\"\n"
    ))
    .unwrap()
    .actions[0]
        .effector
        .clone()
        .unwrap();
    assert_eq!(effector.timeout, Duration::from_millis(2000));
    assert!(!effector.honours_idempotency_key);
    assert_eq!(effector.lookup_url, None);
    assert_eq!(effector.max_attempts, 5);
}

#[test]
fn poll_mode_needs_no_webhook_secret_and_base_url_loses_its_slash() {
    let config = parse(
        r#"
[[bots]]
name = "shop"
token_env = "SHOP_BOT_TOKEN"
mode = "poll"
poll_timeout_secs = 0
api_base_url = "http://127.0.0.1:8081/"
"#,
    )
    .unwrap();
    let bot = &config.bots[0];
    assert_eq!(bot.mode, BotMode::Poll);
    assert!(bot.webhook_secret.is_none());
    assert_eq!(bot.poll_timeout, Duration::ZERO);
    assert_eq!(bot.api_base_url, "http://127.0.0.1:8081");
}

#[test]
fn debug_output_shows_no_secret() {
    let text = format!(
        "[storage]\nurl = \"postgres://app:CANARY-db-password@db.example/ledger\"\n\
         [api]\nadmin_token_env = \"OPLEDGER_ADMIN_TOKEN\"\n{BOT}{ACTION}"
    );
    let config = parse(&text).unwrap();
    let debug = format!("{config:?}");
    let pretty = format!("{config:#?}");
    for shown in [&debug, &pretty] {
        assert!(!shown.contains("CANARY"), "a secret leaked: {shown}");
        assert!(!shown.contains("canary"), "a secret leaked: {shown}");
    }
    assert!(debug.contains("postgres://app:***@db.example/ledger"));
    assert!(debug.contains("SHOP_BOT_TOKEN"), "variable names are shown");
    assert_eq!(
        config.storage.url.expose_secret(),
        "postgres://app:CANARY-db-password@db.example/ledger"
    );
}

#[test]
fn storage_urls_are_redacted() {
    let url =
        StorageUrl::new("postgresql://u:p@h:5432/db?password=CANARY&sslmode=require").unwrap();
    assert_eq!(url.backend(), StorageBackend::Postgres);
    assert_eq!(
        url.redacted(),
        "postgresql://u:***@h:5432/db?password=***&sslmode=require"
    );
    assert_eq!(
        StorageUrl::new("sqlite::memory:").unwrap().redacted(),
        "sqlite::memory:"
    );
}

// One test per kind of error, each with its exact message.

#[test]
fn unknown_key_at_top_level() {
    assert_eq!(
        error("[storge]\nurl = \"sqlite://x.db\"\n"),
        "config key `storge`: unknown key; check its spelling (keys allowed here: storage, \
         server, api, bots, actions)"
    );
}

#[test]
fn unknown_key_in_a_section() {
    assert_eq!(
        error("[server]\nlisten = \"127.0.0.1:1\"\nbody_limit = 5\n"),
        "config key `server.body_limit`: unknown key; check its spelling (keys allowed here: \
         listen, body_limit_bytes, request_timeout_ms, shutdown_grace_ms, \
         dedup_retention_hours, store_raw_updates, connection_limit, header_read_timeout_ms, \
         idle_timeout_ms)"
    );
}

#[test]
fn unknown_key_in_a_bot() {
    assert_eq!(
        error(&format!(
            "{BOT}\n[[bots]]\nname = \"other\"\ntokn_env = \"X\"\n"
        )),
        "config key `bots[1].tokn_env`: unknown key; check its spelling (keys allowed here: \
         name, token_env, webhook_secret_env, api_base_url, mode, poll_timeout_secs, \
         max_connections, forward)"
    );
}

#[test]
fn a_secret_written_in_the_file_is_an_unknown_key_and_is_not_echoed() {
    let message = error(
        "[[bots]]\nname = \"shop\"\ntoken = \"123456:CANARY\"\ntoken_env = \"SHOP_BOT_TOKEN\"\n",
    );
    assert_eq!(
        message,
        "config key `bots[0].token`: unknown key; secrets never go in the config file: name the \
         environment variable that holds it with `token_env` (keys allowed here: name, \
         token_env, webhook_secret_env, api_base_url, mode, poll_timeout_secs, max_connections, forward)"
    );
}

#[test]
fn the_admin_token_is_read_from_the_environment_and_checked() {
    let api = |var: &str| format!("[api]\nadmin_token_env = \"{var}\"\n");
    assert!(parse("[api]\n").unwrap().api.admin_token.is_none());
    assert_eq!(
        error(&api("ADMIN_TOKEN_MISSING")),
        "config key `api.admin_token_env`: environment variable `ADMIN_TOKEN_MISSING` is not \
         set; export it with the read API's admin token"
    );
    assert_eq!(
        error(&api("EMPTY_VAR")),
        "config key `api.admin_token_env`: environment variable `EMPTY_VAR` is empty; export it \
         with the read API's admin token"
    );
    for var in ["SHORT_TOKEN", "SPACED_TOKEN"] {
        assert_eq!(
            error(&api(var)),
            format!(
                "config key `api.admin_token_env`: environment variable `{var}` does not hold a \
                 usable admin token; use 16 to 512 visible ASCII characters without spaces, \
                 e.g. the output of `openssl rand -hex 32`"
            )
        );
    }
    let pasted = error(&api("CANARY-admin-token-0123456789abcdef"));
    assert!(!pasted.contains("CANARY"), "not echoed: {pasted}");
    assert!(pasted.starts_with("config key `api.admin_token_env`: must name an environment"));
    assert_eq!(
        error("[api]\nadmin_token = \"CANARY-admin-token-0123456789abcdef\"\n"),
        "config key `api.admin_token`: unknown key; secrets never go in the config file: name \
         the environment variable that holds it with `admin_token_env` (keys allowed here: \
         admin_token_env, clients)"
    );
}

#[test]
fn unknown_key_in_an_action() {
    assert_eq!(
        error(&format!("{BOT}{ACTION}repeat_window = 30\n")),
        "config key `actions[0].repeat_window`: unknown key; check its spelling (keys allowed \
         here: name, bot, command, params, key, repeat_window_secs, confirm, \
         confirm_expiry_secs, effector, reply)"
    );
}

#[test]
fn unknown_key_in_an_effector() {
    assert_eq!(
        error(&format!(
            "{BOT}{ACTION}[actions.effector]\nurl = \"http://127.0.0.1:9000/c\"\nretries = 3\n"
        )),
        "config key `actions[0].effector.retries`: unknown key; check its spelling (keys \
         allowed here: url, in_process, timeout_ms, honours_idempotency_key, lookup_url, max_attempts)"
    );
}

#[test]
fn wrong_type() {
    assert_eq!(
        error("[server]\nstore_raw_updates = \"yes\"\n"),
        "config key `server.store_raw_updates`: has the wrong type; it must be true or false"
    );
    assert_eq!(
        error(&format!("{BOT}max_connections = \"many\"\n")),
        "config key `bots[0].max_connections`: has the wrong type; it must be an integer"
    );
}

#[test]
fn invalid_toml_names_the_line() {
    assert_eq!(
        error("[server]\nlisten = 127.0.0.1:8080\n"),
        "config file line 2, column 15: invalid TOML: invalid float, expected nothing; fix the \
         file's syntax"
    );
}

#[test]
fn missing_env_var() {
    assert_eq!(
        error("[[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN_MISSING\"\n"),
        "config key `bots[0].token_env`: environment variable `SHOP_TOKEN_MISSING` is not set; \
         export it with the bot token"
    );
}

#[test]
fn empty_env_var() {
    assert_eq!(
        error("[[bots]]\nname = \"shop\"\ntoken_env = \"EMPTY_VAR\"\n"),
        "config key `bots[0].token_env`: environment variable `EMPTY_VAR` is empty; export it \
         with the bot token"
    );
}

#[test]
fn env_key_holding_something_else_than_a_name_is_not_echoed() {
    assert_eq!(
        error("[[bots]]\nname = \"shop\"\ntoken_env = \"123456:CANARY\"\n"),
        "config key `bots[0].token_env`: must name an environment variable (A-Z, 0-9 and _, \
         not starting with a digit) that holds the bot token; the secret itself never goes in \
         the config file"
    );
}

#[test]
fn webhook_secret_required_in_webhook_mode() {
    assert_eq!(
        error("[[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_BOT_TOKEN\"\n"),
        "config key `bots[0].webhook_secret_env`: is required when mode is \"webhook\"; name the \
         environment variable that holds the webhook secret, e.g. \"SHOP_WEBHOOK_SECRET\""
    );
}

#[test]
fn bad_webhook_secret_charset() {
    assert_eq!(
        error(
            "[[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_BOT_TOKEN\"\n\
             webhook_secret_env = \"BAD_SECRET\"\n"
        ),
        "config key `bots[0].webhook_secret_env`: environment variable `BAD_SECRET` does not \
         hold a valid webhook secret; Telegram accepts 1 to 256 characters of A-Z, a-z, 0-9, _ \
         and -"
    );
}

#[test]
fn bad_bot_name_and_mode_and_base_url() {
    assert_eq!(
        error("[[bots]]\nname = \"Shop\"\n"),
        "config key `bots[0].name`: bot name \"Shop\" is invalid: use 1 to 64 characters from \
         a-z, 0-9 and _"
    );
    assert_eq!(
        error(&format!("{BOT}mode = \"polling\"\n")),
        "config key `bots[0].mode`: must be \"webhook\" or \"poll\", not \"polling\""
    );
    assert_eq!(
        error(&format!(
            "{BOT}api_base_url = \"https://api.telegram.org/bot\"\n"
        )),
        "config key `bots[0].api_base_url`: must be only a scheme, host and optional port, e.g. \
         \"https://api.telegram.org\" (opledger appends /bot<token>/<method> itself)"
    );
}

#[test]
fn malformed_template() {
    assert_eq!(
        error(&format!(
            "{BOT}{}",
            ACTION.replace("{campaign}:", "{campaign:")
        )),
        "config key `actions[0].key`: unclosed `{` at character 1; close the placeholder with \
         `}`, or write `{{` for a literal `{`"
    );
}

#[test]
fn unknown_placeholder() {
    assert_eq!(
        error(&format!("{BOT}{}", ACTION.replace("{campaign}:", "{foo}:"))),
        "config key `actions[0].key`: unknown placeholder `{foo}`; use a param (campaign) or \
         one of user_id, chat_id, bot, action"
    );
    assert_eq!(
        error(&format!(
            "{BOT}{ACTION}[actions.reply]\nconfirmed = \"Your coupon: {{result.code}} {{eror}}\"\n"
        )),
        "config key `actions[0].reply.confirmed`: unknown placeholder `{eror}`; use a param \
         (campaign) or one of result.<field>, external_id, operation_id, action"
    );
    assert_eq!(
        error(&format!(
            "{BOT}{ACTION}[actions.effector]\nurl = \"http://127.0.0.1:9000/c\"\n\
             lookup_url = \"http://127.0.0.1:9000/c/{{id}}\"\n"
        )),
        "config key `actions[0].effector.lookup_url`: unknown placeholder `{id}`; the only \
         placeholder allowed in a URL is {operation_id}"
    );
}

#[test]
fn a_confirmation_asks_a_question_with_the_replies_placeholders() {
    let confirm = |extra: &str| format!("{BOT}{ACTION}{extra}");
    let config = parse(&confirm(
        "confirm = \"Issue a coupon for {campaign} ({action}, {operation_id})?\"\n",
    ))
    .unwrap();
    let asked = config.actions[0].confirm.clone().expect("a confirmation");
    assert_eq!(
        asked.expiry,
        Duration::from_secs(600),
        "ten minutes by default"
    );
    let question = asked
        .question
        .render(&|name| Some(format!("<{name}>")))
        .unwrap();
    assert_eq!(
        question,
        "Issue a coupon for <campaign> (<action>, <operation_id>)?"
    );
    let config = parse(&confirm("confirm = \"Sure?\"\nconfirm_expiry_secs = 30\n")).unwrap();
    assert_eq!(
        config.actions[0].confirm.as_ref().unwrap().expiry,
        Duration::from_secs(30)
    );

    for (extra, message) in [
        (
            "confirm = \"Issue {code}?\"\n",
            "config key `actions[0].confirm`: unknown placeholder `{code}`; use a param \
             (campaign) or one of operation_id, action",
        ),
        (
            "confirm = \"For {user_id}?\"\n",
            "config key `actions[0].confirm`: unknown placeholder `{user_id}`; use a param \
             (campaign) or one of operation_id, action",
        ),
        (
            "confirm = \" \"\n",
            "config key `actions[0].confirm`: the reply is empty; Telegram cannot send an empty \
             message, so write some text",
        ),
        (
            "confirm = \"Sure {campaign?\"\n",
            "config key `actions[0].confirm`: unclosed `{` at character 6; close the \
             placeholder with `}`, or write `{{` for a literal `{`",
        ),
        (
            "confirm = \"Sure?\"\nconfirm_expiry_secs = 0\n",
            "config key `actions[0].confirm_expiry_secs`: 0 is out of range; use 1 to 604800 \
             seconds (a week at most)",
        ),
        (
            "confirm_expiry_secs = 60\n",
            "config key `actions[0].confirm_expiry_secs`: is set without `confirm`; write the \
             question the command asks, or remove it",
        ),
        (
            "confirm = \"Sure?\"\nrepeat_window_secs = 60\n",
            "config key `actions[0].confirm`: cannot be combined with `repeat_window_secs`; \
             confirm once-only actions, or drop one of the two",
        ),
    ] {
        assert_eq!(error(&confirm(extra)), message, "{extra}");
    }
}

#[test]
fn duplicate_command() {
    let second = ACTION.replace("\"coupon\"\nbot", "\"coupon2\"\nbot");
    assert_eq!(
        error(&format!("{BOT}{ACTION}{second}")),
        "config key `actions[1].command`: duplicate command `/coupon` for bot `shop` (also \
         actions[0], action `coupon`); give each action of a bot its own command"
    );
}

#[test]
fn same_command_on_two_bots_is_fine() {
    let other_bot =
        "[[bots]]\nname = \"other\"\ntoken_env = \"OTHER_BOT_TOKEN\"\nmode = \"poll\"\n";
    let second = ACTION.replace("\"coupon\"\nbot = \"shop\"", "\"coupon2\"\nbot = \"other\"");
    let config = parse(&format!("{BOT}{other_bot}{ACTION}{second}")).unwrap();
    assert_eq!(
        config.action_for_command("other", "coupon").unwrap().name,
        "coupon2"
    );
}

#[test]
fn duplicate_action_name() {
    let second = ACTION.replace("command = \"coupon\"", "command = \"coupon2\"");
    assert_eq!(
        error(&format!("{BOT}{ACTION}{second}")),
        "config key `actions[1].name`: duplicate action name `coupon` (also actions[0].name); \
         action names must be unique because they name the operations' streams"
    );
}

#[test]
fn duplicate_bot() {
    assert_eq!(
        error(&format!("{BOT}{BOT}")),
        "config key `bots[1].name`: duplicate bot name `shop` (also bots[0].name); give each bot \
         its own name"
    );
}

#[test]
fn action_naming_an_unknown_bot() {
    assert_eq!(
        error(&format!(
            "{BOT}{}",
            ACTION.replace("bot = \"shop\"", "bot = \"shp\"")
        )),
        "config key `actions[0].bot`: names no configured bot `shp`; configured bots: shop"
    );
}

#[test]
fn reserved_command() {
    assert_eq!(
        error(&format!(
            "{BOT}{}",
            ACTION.replace("command = \"coupon\"", "command = \"status\"")
        )),
        "config key `actions[0].command`: `/status` is reserved for the built-in query that \
         answers it; choose another command"
    );
}

#[test]
fn bad_params() {
    assert_eq!(
        error(&format!(
            "{BOT}{}",
            ACTION.replace("[\"campaign\"]", "[\"campaign\", \"campaign\"]")
        )),
        "config key `actions[0].params[1]`: duplicate param `campaign` (also params[0]); name \
         each param once"
    );
    assert_eq!(
        error(&format!(
            "{BOT}{}",
            ACTION.replace("[\"campaign\"]", "[\"user_id\"]")
        )),
        "config key `actions[0].params[0]`: `user_id` is a built-in placeholder name, so a \
         template could not tell them apart; give the param another name"
    );
}

#[test]
fn bad_listen_address() {
    assert_eq!(
        error("[server]\nlisten = \"localhost:8080\"\n"),
        "config key `server.listen`: `localhost:8080` is not an IP address with a port; write \
         e.g. \"127.0.0.1:8080\" (host names are not resolved)"
    );
}

#[test]
fn retention_out_of_range() {
    assert_eq!(
        error("[server]\ndedup_retention_hours = 24\n"),
        "config key `server.dedup_retention_hours`: 24 is out of range; use 25 to 167 hours: \
         more than 24 (Telegram retries an update for up to 24 h) and less than 168 (update ids \
         may restart at random after a week of silence)"
    );
    assert!(parse("[server]\ndedup_retention_hours = 167\n").is_ok());
    assert!(
        error("[server]\ndedup_retention_hours = 168\n")
            .starts_with("config key `server.dedup_retention_hours`: 168 is out of range")
    );
}

#[test]
fn bad_storage_url_hides_the_rest_of_the_url() {
    assert_eq!(
        error("[storage]\nurl = \"mysql://root:CANARY@db/x\"\n"),
        "config key `storage.url`: must start with `sqlite:`, `postgres://` or `postgresql://` \
         (not `mysql:`)"
    );
    assert_eq!(
        error("[storage]\n"),
        "config key `storage.url`: is required when [storage] is present; write e.g. \
         \"sqlite://opledger.db\" or \"postgres://user@host/db\", or remove [storage] for the \
         SQLite default"
    );
}

#[test]
fn key_without_placeholder() {
    assert_eq!(
        error(&format!(
            "{BOT}{}",
            ACTION.replace("\"{campaign}:{user_id}\"", "\"x\"")
        )),
        "config key `actions[0].key`: the key has no placeholder, so every request would be the \
         same operation; use e.g. {user_id}, or {action} if the action really happens once ever"
    );
}

#[test]
fn errors_expose_their_key() {
    let err = parse("[server]\nlisten = \"nope\"\n").unwrap_err();
    assert_eq!(err.key(), Some("server.listen"));
    let err = parse("[server\n").unwrap_err();
    assert_eq!(err.key(), None);
}

#[test]
fn the_edge_limits_are_read_and_checked() {
    let config = parse(
        "[server]\nconnection_limit = 64\nheader_read_timeout_ms = 2500\nidle_timeout_ms = 100\n",
    )
    .unwrap();
    assert_eq!(config.server.connection_limit, 64);
    assert_eq!(
        config.server.header_read_timeout,
        Duration::from_millis(2500)
    );
    assert_eq!(config.server.idle_timeout, Duration::from_millis(100));
    assert_eq!(
        error("[server]\nconnection_limit = 15\n"),
        "config key `server.connection_limit`: 15 is out of range; use 16 to 65536 connections; \
         each holds a file descriptor, and some of the limit is kept for authenticated \
         deliveries and health probes"
    );
    assert_eq!(
        error("[server]\nheader_read_timeout_ms = 60001\n"),
        "config key `server.header_read_timeout_ms`: 60001 is out of range; use 100 to 60000 ms; \
         a client slower than this to send a request's head or take an answer is cut off, and \
         Telegram sends its requests at once"
    );
    assert_eq!(
        error("[server]\nidle_timeout_ms = 99\n"),
        "config key `server.idle_timeout_ms`: 99 is out of range; use 100 to 600000 ms; an idle \
         connection holds a file descriptor"
    );
    assert!(
        error("[server]\nconnection_limit = \"many\"\n")
            .starts_with("config key `server.connection_limit`: has the wrong type"),
    );
}

#[test]
fn other_values_out_of_range_or_malformed() {
    assert_eq!(
        error(&format!("{BOT}max_connections = 0\n")),
        "config key `bots[0].max_connections`: 0 is out of range; use 1 to 100 (Telegram's range \
         for setWebhook)"
    );
    assert_eq!(
        error("[server]\nrequest_timeout_ms = 60000\n"),
        "config key `server.request_timeout_ms`: 60000 is out of range; use 100 to 30000 ms; \
         Telegram waits at most 60 s for an answer, so stay well under it"
    );
    assert_eq!(
        error(&format!(
            "{BOT}{}",
            ACTION.replace("command = \"coupon\"", "command = \"/coupon\"")
        )),
        "config key `actions[0].command`: write the command without its slash: \"coupon\", not \
         \"/coupon\""
    );
    assert_eq!(
        error(&format!(
            "{BOT}{ACTION}[actions.effector]\nurl = \"http://u:CANARY@127.0.0.1:9000/c\"\n"
        )),
        "config key `actions[0].effector.url`: must not contain a user name or password: \
         secrets never go in the config file"
    );
    assert_eq!(
        error(&format!(
            "{BOT}{ACTION}[actions.effector]\nmax_attempts = 0\n"
        )),
        "config key `actions[0].effector.url`: is required; write the URL the action POSTs to, \
         e.g. \"http://127.0.0.1:9000/coupons\" (or in_process = true in a Rust program that embeds \
         opledger)"
    );
}

/// The URL parser reads `http:///x` as host `x`, drops tabs and turns backslashes into slashes;
/// every URL-valued key refuses what it would reinterpret, in one line naming the key.
#[test]
fn urls_the_parser_would_reinterpret_are_refused() {
    let effector = |url: &str| {
        error(&format!(
            "{BOT}{ACTION}[actions.effector]\nurl = \"{url}\"\n"
        ))
    };
    let no_host = "config key `actions[0].effector.url`: must name a host right after `http://`, \
                   e.g. \"http://127.0.0.1:9000/path\"";
    for url in [
        "http:///x",
        "http:/x",
        "http:x",
        "http:///",
        "http://?x",
        "http://#x",
    ] {
        assert_eq!(effector(url), no_host, "{url}");
    }
    assert_eq!(
        effector("https:////x/coupons"),
        "config key `actions[0].effector.url`: must name a host right after `https://`, e.g. \
         \"https://127.0.0.1:9000/path\""
    );
    let backslash = "config key `actions[0].effector.url`: must separate its parts with `/`, not \
                     `\\`";
    for url in ["http:\\\\\\\\x/c", "http://x\\\\c", "http:/\\\\x/c"] {
        assert_eq!(effector(url), backslash, "{url}");
    }
    assert_eq!(
        effector("http://ex\\tample.com/c"),
        "config key `actions[0].effector.url`: must not contain spaces or control characters \
         (found U+0009); percent-encode them"
    );
    assert_eq!(
        effector(" http://127.0.0.1:9000/c"),
        "config key `actions[0].effector.url`: must not contain spaces or control characters \
         (found U+0020); percent-encode them"
    );
    assert_eq!(
        effector("http://127.0.0.1:9000/c\\n"),
        "config key `actions[0].effector.url`: must not contain spaces or control characters \
         (found U+000A); percent-encode them"
    );
    assert_eq!(effector("http://"), no_host);
    assert_eq!(
        effector("http://:9000/c"),
        "config key `actions[0].effector.url`: is not a valid URL: empty host"
    );
    assert_eq!(
        effector("ftp:///x"),
        "config key `actions[0].effector.url`: must be an http:// or https:// URL, not ftp:"
    );

    assert_eq!(
        error(&format!(
            "{BOT}{ACTION}[actions.effector]\nurl = \"http://127.0.0.1:9000/c\"\n\
             lookup_url = \"http:///c/{{operation_id}}\"\n"
        )),
        "config key `actions[0].effector.lookup_url`: must name a host right after `http://`, \
         e.g. \"http://127.0.0.1:9000/path\""
    );
    assert_eq!(
        error(&format!(
            "{BOT}{ACTION}[actions.effector]\nurl = \"http://127.0.0.1:9000/c\"\n\
             lookup_url = \"http://127.0.0.1:9000/c/ {{operation_id}}\"\n"
        )),
        "config key `actions[0].effector.lookup_url`: must not contain spaces or control \
         characters (found U+0020); percent-encode them"
    );
    assert_eq!(
        error(&format!(
            "{BOT}api_base_url = \"https:///api.telegram.org\"\n"
        )),
        "config key `bots[0].api_base_url`: must name a host right after `https://`, e.g. \
         \"https://127.0.0.1:9000/path\""
    );
    assert_eq!(
        error(&format!(
            "{BOT}api_base_url = \"https:\\\\\\\\api.telegram.org\"\n"
        )),
        "config key `bots[0].api_base_url`: must separate its parts with `/`, not `\\`"
    );

    // Written in full, they are fine.
    for url in [
        "http://127.0.0.1:9000/c",
        "https://[::1]:8443/c?x=1",
        "HTTP://Coupons.Example/c",
    ] {
        let config = parse(&format!(
            "{BOT}{ACTION}[actions.effector]\nurl = \"{url}\"\n\
             lookup_url = \"{url}/{{operation_id}}\"\n"
        ))
        .unwrap_or_else(|e| panic!("{url}: {e}"));
        let effector = config.actions[0].effector.as_ref().unwrap();
        assert!(effector.url.as_ref().unwrap().host().is_some(), "{url}");
    }
}

/// `[[api.clients]]`: a client token scoped to one configured bot, apart from the admin token
/// and from every other client's.
#[test]
fn api_clients_are_scoped_to_a_configured_bot_with_a_token_of_their_own() {
    let client = |name: &str, bot: &str, var: &str| {
        format!("[[api.clients]]\nname = \"{name}\"\nbot = \"{bot}\"\ntoken_env = \"{var}\"\n")
    };
    let config = parse(&format!(
        "{BOT}{ACTION}[api]\nadmin_token_env = \"OPLEDGER_ADMIN_TOKEN\"\n{}{}",
        client("shop_handlers", "shop", "SHOP_API_TOKEN"),
        client("shop_jobs", "shop", "OTHER_API_TOKEN"),
    ))
    .unwrap();
    let clients: Vec<(&str, &str, &str)> = config
        .api
        .clients
        .iter()
        .map(|c| (c.name.as_str(), c.bot.as_str(), c.token.expose_secret()))
        .collect();
    assert_eq!(
        clients,
        [
            ("shop_handlers", "shop", CLIENT_TOKEN),
            ("shop_jobs", "shop", "CANARY-other-client-0123456789")
        ]
    );
    assert!(
        !format!("{:?}", config.api).contains("CANARY"),
        "Debug shows no token"
    );
    // Clients without an admin token: the operations API is on, the read routes are not.
    let alone = parse(&format!("{BOT}{}", client("h", "shop", "SHOP_API_TOKEN"))).unwrap();
    assert!(alone.api.admin_token.is_none());
    assert_eq!(alone.api.clients.len(), 1);

    assert_eq!(
        error(&format!("{BOT}{}", client("h", "nope", "SHOP_API_TOKEN"))),
        "config key `api.clients[0].bot`: no bot named `nope` is configured; use one of: shop"
    );
    assert_eq!(
        error(&format!(
            "{BOT}{}{}",
            client("h", "shop", "SHOP_API_TOKEN"),
            client("h", "shop", "OTHER_API_TOKEN")
        )),
        "config key `api.clients[1].name`: duplicate client name `h` (also api.clients[0].name); \
         give each client its own name"
    );
    assert_eq!(
        error(&format!(
            "{BOT}{}{}",
            client("a", "shop", "SHOP_API_TOKEN"),
            client("b", "shop", "SHOP_API_TOKEN_AGAIN")
        )),
        "config key `api.clients[1].token_env`: environment variable `SHOP_API_TOKEN_AGAIN` \
         holds the same token as api.clients[0]; give each client a token of its own, apart \
         from the admin token, so that one can be revoked without the other"
    );
    let shared = error(&format!(
        "{BOT}[api]\nadmin_token_env = \"OPLEDGER_ADMIN_TOKEN\"\n{}",
        client("a", "shop", "SAME_AS_ADMIN")
    ));
    assert!(
        shared.contains("holds the same token as the admin token"),
        "{shared}"
    );
    assert!(!shared.contains("CANARY"), "{shared}");
    assert_eq!(
        error(&format!("{BOT}{}", client("a", "shop", "SHORT_TOKEN"))),
        "config key `api.clients[0].token_env`: environment variable `SHORT_TOKEN` does not hold \
         a usable client token; use 16 to 512 visible ASCII characters without spaces, e.g. the \
         output of `openssl rand -hex 32`"
    );
    assert_eq!(
        error(&format!(
            "{BOT}{}",
            client("admin", "shop", "SHOP_API_TOKEN")
        )),
        "config key `api.clients[0].name`: `admin` is reserved for what the admin token starts; \
         give the client another name"
    );
    assert_eq!(
        error(&format!(
            "{BOT}{}",
            client("Bad-Name", "shop", "SHOP_API_TOKEN")
        )),
        "config key `api.clients[0].name`: client name \"Bad-Name\" is invalid: use 1 to 64 \
         characters from a-z, 0-9 and _"
    );
    assert_eq!(
        error(&format!(
            "{BOT}[[api.clients]]\nname = \"a\"\nbot = \"shop\"\ntoken = \"x\"\n"
        )),
        "config key `api.clients[0].token`: unknown key; secrets never go in the config file: \
         name the environment variable that holds it with `token_env` (keys allowed here: name, \
         bot, token_env)"
    );
}

/// Found by the `config` fuzz target: a value or key quoted from the file kept its line breaks
/// and escape sequences, so the refusal was not one line.
#[test]
fn quoted_values_and_keys_keep_the_refusal_on_one_line() {
    assert_eq!(
        error("[server]\nlisten = \"a\\nb\\u001b[2J\"\n"),
        "config key `server.listen`: `a\\u000ab\\u001b[2J` is not an IP address with a port; \
         write e.g. \"127.0.0.1:8080\" (host names are not resolved)"
    );
    let unknown = error("[server]\n\"x\\ty\" = 1\n");
    assert!(
        unknown.starts_with("config key `server.x\\u0009y`: unknown key"),
        "{unknown}"
    );
    for message in [
        error("[server]\nlisten = \"a\\rb\"\n"),
        error("[server]\n\"x\\u0085y\" = 1\n"),
    ] {
        assert!(!message.chars().any(char::is_control), "{message:?}");
    }
}

#[test]
fn a_gateway_is_read_with_its_defaults() {
    let config = parse(&format!(
        "{BOT}[bots.forward]\nurl = \"http://127.0.0.1:8081/webhook\"\n"
    ))
    .unwrap();
    let forward = config.bots[0].forward.as_ref().expect("a gateway");
    assert_eq!(
        forward.target,
        opledger_config::ForwardTarget::Webhook("http://127.0.0.1:8081/webhook".parse().unwrap())
    );
    assert_eq!(forward.updates, opledger_config::ForwardUpdates::Unhandled);
    assert_eq!(forward.timeout, Duration::from_secs(10));
    assert_eq!(forward.give_up_after, Duration::from_secs(86_400));
    assert!(forward.secret.is_none());
    let example = parse(include_str!("../../../opledger.example.toml")).unwrap();
    let crm = example
        .bot("crm")
        .and_then(|b| b.forward.as_ref())
        .expect("the example's");
    assert!(crm.secret.is_some());
    assert!(
        example
            .redactor()
            .redact("echo canary_upstream-secret")
            .contains("[redacted]"),
        "the upstream secret is scrubbed from outside text like every secret"
    );
}

#[test]
fn a_bad_gateway_names_its_key() {
    for (keys, key, words) in [
        ("", "bots[0].forward.url", "is required"),
        (
            "in_process = false\n",
            "bots[0].forward.url",
            "in_process = true",
        ),
        (
            "url = \"http://127.0.0.1/x\"\nin_process = true\n",
            "bots[0].forward.in_process",
            "cannot be combined with url",
        ),
        ("in_process = \"yes\"\n", "bots[0].forward.in_process", ""),
        ("url = \"ftp://x/y\"\n", "bots[0].forward.url", ""),
        (
            "url = \"http://user:pw@127.0.0.1/x\"\n",
            "bots[0].forward.url",
            "must not contain a user name or password",
        ),
        (
            "url = \"http://127.0.0.1/x\"\nupdates = \"some\"\n",
            "bots[0].forward.updates",
            "\"all\" or \"unhandled\"",
        ),
        (
            "url = \"http://127.0.0.1/x\"\ntimeout_ms = 50\n",
            "bots[0].forward.timeout_ms",
            "out of range",
        ),
        (
            "url = \"http://127.0.0.1/x\"\ngive_up_after_secs = 0\n",
            "bots[0].forward.give_up_after_secs",
            "out of range",
        ),
        (
            "url = \"http://127.0.0.1/x\"\nsecret_env = \"BAD_SECRET\"\n",
            "bots[0].forward.secret_env",
            "valid webhook secret",
        ),
        (
            "url = \"http://127.0.0.1/x\"\nsecret = \"x\"\n",
            "",
            "secret",
        ),
    ] {
        let error = parse(&format!("{BOT}[bots.forward]\n{keys}"))
            .expect_err(keys)
            .to_string();
        assert!(error.contains(key), "{keys}: {error}");
        assert!(error.contains(words), "{keys}: {error}");
        assert!(
            !error.contains("has spaces and !"),
            "never the secret: {error}"
        );
    }
}

#[test]
fn an_embedding_program_s_handlers_can_take_a_bot_s_updates() {
    let config = parse(&format!(
        "{BOT}[bots.forward]\nin_process = true\nupdates = \"all\"\ntimeout_ms = 30000\n"
    ))
    .unwrap();
    let forward = config.bots[0].forward.as_ref().expect("a hand-over");
    assert_eq!(forward.target, opledger_config::ForwardTarget::InProcess);
    assert_eq!(forward.updates, opledger_config::ForwardUpdates::All);
    assert_eq!(forward.timeout, Duration::from_secs(30));
}

#[test]
fn an_action_without_a_command_is_started_only_by_a_program() {
    let config = parse(&format!(
        "{BOT}[[actions]]\nname = \"coupon\"\nbot = \"shop\"\nparams = [\"campaign\"]\n\
         key = \"{{user_id}}:{{campaign}}\"\n\
         [[actions]]\nname = \"refund\"\nbot = \"shop\"\nkey = \"{{user_id}}\"\n"
    ))
    .unwrap();
    assert_eq!(config.actions[0].command, None);
    assert_eq!(config.actions[1].command, None, "two actions without one");
    assert!(config.action_for_command("shop", "coupon").is_none());
    assert_eq!(
        error(&format!(
            "{BOT}[[actions]]\nname = \"coupon\"\nbot = \"shop\"\nkey = \"{{user_id}}\"\n\
             confirm = \"Sure?\"\n"
        )),
        "config key `actions[0].confirm`: needs a command: the confirmation answers the action's \
         command; add `command` (without its slash, e.g. \"coupon\") or issue buttons with POST \
         /v1/buttons"
    );
}

#[test]
fn an_in_process_effector_says_itself_how_it_is_called() {
    let config = parse(&format!(
        "{BOT}{ACTION}[actions.effector]\nin_process = true\nmax_attempts = 4\n"
    ))
    .unwrap();
    let effector = config.actions[0].effector.as_ref().unwrap();
    assert_eq!(effector.url, None);
    assert_eq!(effector.max_attempts, 4);
    for (key, line) in [
        ("url", "url = \"http://127.0.0.1:9000/c\""),
        ("timeout_ms", "timeout_ms = 100"),
        ("honours_idempotency_key", "honours_idempotency_key = true"),
        (
            "lookup_url",
            "lookup_url = \"http://127.0.0.1:9000/c/{operation_id}\"",
        ),
    ] {
        let message = error(&format!(
            "{BOT}{ACTION}[actions.effector]\nin_process = true\n{line}\n"
        ));
        assert_eq!(
            message,
            format!(
                "config key `actions[0].effector.{key}`: cannot be combined with in_process = \
                 true: an in-process effector says itself how it is called (the `Effector` \
                 trait); remove the key"
            )
        );
    }
}
