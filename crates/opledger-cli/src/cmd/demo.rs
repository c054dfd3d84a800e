//! `opledger demo`: opledger at work in one command, with no Telegram account. In this
//! process, on loopback ports the system picks, it starts a fake Telegram (`demo/telegram.rs`),
//! a fake shop that issues coupons (`demo/shop.rs`) and the real service (the same
//! [`Service`] as `opledger serve`: app, worker and read models) on a fresh SQLite ledger, with a
//! built-in configuration and secrets generated for the run. Then it tells a story
//! (`demo/story.rs`): a coupon request, its redelivery, a double click, a call that times out,
//! and what the user, the ledger and the shop see. Every claim is checked against what the
//! ledger and the fakes hold (`demo/checks.rs`); one that does not hold ends the demo with
//! exit code 1.

mod checks;
mod shop;
mod story;
mod telegram;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use opledger_config::Config;

use crate::BadUsage;
use crate::cmd::serve::{Serve, Service, say};
use crate::database;
use shop::FakeShop;
use telegram::{FakeTelegram, Webhook};

/// The demo bot's name.
const BOT: &str = "shop";
/// The user in the story, and her private chat with the bot.
const USER: i64 = 42;
const USER_NAME: &str = "Ana";

/// The configuration the demo runs with; `@TELEGRAM@` and `@SHOP@` are the fakes' URLs, the
/// secrets come from [`Secrets`]. The shop neither honours the idempotency key nor offers a
/// lookup, so an unknown outcome waits for a person.
const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"

[[api.clients]]
name = "shop_handlers"
bot = "shop"
token_env = "DEMO_CLIENT_TOKEN"

[[bots]]
name = "shop"
token_env = "DEMO_BOT_TOKEN"
webhook_secret_env = "DEMO_WEBHOOK_SECRET"
api_base_url = "@TELEGRAM@"

[[actions]]
name = "coupon"
bot = "shop"
command = "coupon"
params = ["campaign"]
key = "{campaign}:{user_id}"

[actions.effector]
url = "@SHOP@"
timeout_ms = 300
honours_idempotency_key = false

[actions.reply]
confirmed = "Your {campaign} coupon: {result.code}"
"#;

#[derive(Debug, clap::Args)]
pub(crate) struct Demo {
    /// Keep the demo's ledger in this SQLite file (which must not exist yet), to explore it
    /// afterwards; by default the ledger is a temporary file, removed at the end.
    #[arg(long, value_name = "PATH")]
    ledger: Option<PathBuf>,
}

/// The run's secrets, made up for it and never shown.
#[derive(Debug)]
struct Secrets {
    bot_token: String,
    webhook_secret: String,
    client_token: String,
}

impl Secrets {
    fn generate() -> Secrets {
        let random = || uuid::Uuid::new_v4().simple().to_string();
        Secrets {
            bot_token: format!(
                "{}:{}",
                100_000 + u32::from(uuid::Uuid::new_v4().as_bytes()[0]),
                random()
            ),
            webhook_secret: random(),
            client_token: format!("{}{}", random(), random()),
        }
    }

    fn get(&self, name: &str) -> Option<String> {
        match name {
            "DEMO_BOT_TOKEN" => Some(self.bot_token.clone()),
            "DEMO_WEBHOOK_SECRET" => Some(self.webhook_secret.clone()),
            "DEMO_CLIENT_TOKEN" => Some(self.client_token.clone()),
            _ => None,
        }
    }
}

/// Where the ledger is: a file the user named, or a temporary folder removed at the end.
#[derive(Debug)]
struct Ledger {
    path: PathBuf,
    url: String,
    temporary: Option<tempfile::TempDir>,
}

impl Ledger {
    fn choose(kept: Option<PathBuf>) -> anyhow::Result<Ledger> {
        let (path, temporary) = match kept {
            Some(path) => {
                if path.exists() {
                    return Err(BadUsage(format!(
                        "{} already exists; the demo writes a fresh ledger: remove it or pass \
                         another --ledger path",
                        path.display()
                    ))
                    .into());
                }
                (path, None)
            }
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("opledger-demo-")
                    .tempdir()
                    .context("cannot create a temporary folder for the demo's ledger")?;
                (dir.path().join("demo.db"), Some(dir))
            }
        };
        let Some(text) = path.to_str() else {
            return Err(BadUsage(format!(
                "{} is not valid UTF-8; pass a --ledger path in UTF-8",
                path.display()
            ))
            .into());
        };
        let url = format!("sqlite://{text}");
        Ok(Ledger {
            path,
            url,
            temporary,
        })
    }
}

impl Demo {
    pub(crate) async fn run(self) -> anyhow::Result<()> {
        let ledger = Ledger::choose(self.ledger)?;
        let secrets = Secrets::generate();
        let telegram = FakeTelegram::start(&secrets.bot_token).await?;
        let shop = FakeShop::start().await?;
        let text = CONFIG
            .replace("@TELEGRAM@", &telegram.base_url())
            .replace("@SHOP@", &shop.coupons_url());
        let config = Config::parse(&text, &|name| secrets.get(name))
            .context("the demo's built-in configuration is invalid (a bug in opledger)")?;
        let shop_timeout = config
            .actions
            .iter()
            .find_map(|action| action.effector.as_ref())
            .map_or(Duration::ZERO, |effector| effector.timeout);
        let store = database::open(&ledger.url).await?;
        let service = Service::build(&Serve::default(), &config, store.clone()).await?;
        let listener = tokio::net::TcpListener::bind(config.server.listen)
            .await
            .context("cannot listen on a loopback port for the demo's service")?;
        let address = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(service.run(listener, async {
            let _ = stopped.await;
        }));

        say(format_args!(
            "opledger demo: a shop's Telegram bot, its user {USER_NAME}, Telegram and the shop, \
             all on this machine."
        ));
        say(format_args!(
            "  opledger  http://{address}: the webhook, the worker and the read models, as \
             `opledger serve` runs them"
        ));
        say(format_args!(
            "  ledger    {}{}",
            ledger.url,
            if ledger.temporary.is_some() {
                " (temporary; keep one with --ledger PATH)"
            } else {
                ""
            }
        ));
        say(format_args!(
            "  Telegram  {}: a fake Bot API; the demo delivers updates to the webhook as \
             Telegram does",
            telegram.base_url()
        ));
        say(format_args!(
            "  shop      {}: issues a coupon for every request it gets, ignores Idempotency-Key",
            shop.coupons_url()
        ));
        say(format_args!(
            "  the bot   /coupon <campaign>: one coupon per user and campaign"
        ));
        say(format_args!(""));

        let world = story::World {
            url: &ledger.url,
            store: &store,
            telegram: &telegram,
            shop: &shop,
            webhook: Webhook {
                url: format!("http://{address}/telegram/{BOT}/webhook"),
                secret: secrets.webhook_secret.clone(),
            },
            buttons_url: format!("http://{address}/v1/buttons"),
            client_token: secrets.client_token.clone(),
            shop_timeout,
        };
        let told = story::tell(&world).await;
        let _ = stop.send(());
        let served = running.await.context("the demo's service panicked")?;
        let told = match told {
            Ok(told) => told,
            Err(error) => {
                let kept = match ledger.temporary {
                    Some(dir) => dir.keep().join("demo.db"),
                    None => ledger.path.clone(),
                };
                return Err(error.context(format!(
                    "the demo did not go as expected (the ledger is kept at {} for a look; \
                     please report this with the output above)",
                    kept.display()
                )));
            }
        };
        served?;
        let waiting_coupon = shop
            .coupons()
            .into_iter()
            .find(|c| c.idempotency_key == told.waiting);
        say(format_args!(""));
        say(format_args!(
            "In short: {} deliveries, {} operations, {} coupons issued by the shop, never two for \
             one operation; {} confirmed, {} waiting for a person; {} events in a hash chain that \
             verifies.",
            told.deliveries,
            told.tally.operations,
            told.tally.coupons,
            told.tally.confirmed,
            told.tally.waiting,
            told.events
        ));
        say(format_args!(""));
        explore(
            &ledger,
            &told.waiting,
            waiting_coupon.as_ref().map(|c| c.id.as_str()),
        );
        Ok(())
    }
}

/// Serves `app` on `127.0.0.1` at a port the system picks, until the runtime stops; `what` names
/// it in errors.
async fn serve_locally(app: axum::Router, what: &str) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .with_context(|| format!("cannot listen on a loopback port for the demo's {what}"))?;
    let addr = listener.local_addr()?;
    let what = what.to_owned();
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::warn!(%error, "the demo's {what} stopped");
        }
    });
    Ok(addr)
}

/// How to look further: the read commands on the kept ledger, or how to keep one.
fn explore(ledger: &Ledger, waiting: &str, coupon: Option<&str>) {
    let program = program();
    let on = if ledger.temporary.is_some() {
        say(format_args!(
            "Explore further: this ledger was temporary and is removed now. Keep one with"
        ));
        say(format_args!("  {program} demo --ledger demo.db"));
        say(format_args!("and then look at it:"));
        "sqlite://demo.db".to_owned()
    } else {
        say(format_args!(
            "Explore further: the ledger is kept at {}.",
            ledger.path.display()
        ));
        shell_word(&ledger.url)
    };
    let command = |args: &str, why: &str| {
        say(format_args!(
            "  {program} --database-url {on} {args}{}{why}",
            if why.is_empty() { "" } else { "    # " }
        ));
    };
    command("ops", "the operations and their states");
    command("events", "every event, in ledger order");
    command(&format!("timeline {waiting}"), "one operation's history");
    command("reconcile list", "what waits for a person");
    if let Some(coupon) = coupon {
        say(format_args!(
            "  # the shop's records show {coupon} was issued for it; a person records that:"
        ));
        command(
            &format!(
                "reconcile resolve {waiting} --outcome succeeded --external-id {coupon} \
                 --operator you --note 'found in the shop'"
            ),
            "",
        );
    }
    command("audit verify", "the hash chain, recomputed");
    say(format_args!(
        "To serve a real bot: README.md (Quickstart) and opledger.example.toml."
    ));
}

/// This program as the user can type it: relative to the working directory when it lies
/// below it (`target/release/opledger`), else its full path.
fn program() -> String {
    let Ok(exe) = std::env::current_exe() else {
        return "opledger".to_owned();
    };
    let relative = std::env::current_dir()
        .ok()
        .and_then(|dir| exe.strip_prefix(dir).ok().map(Path::to_path_buf));
    shell_word(&relative.unwrap_or(exe).display().to_string())
}

/// `word` as one shell word: as it is when it holds nothing a shell would read, else quoted.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-:=@%+,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_configuration_is_valid() {
        let secrets = Secrets::generate();
        let text = CONFIG
            .replace("@TELEGRAM@", "http://127.0.0.1:1")
            .replace("@SHOP@", "http://127.0.0.1:2/coupons");
        let config = Config::parse(&text, &|name| secrets.get(name)).unwrap();
        let effector = config.actions[0].effector.as_ref().unwrap();
        assert!(!effector.honours_idempotency_key && effector.lookup_url.is_none());
    }

    #[test]
    fn printed_commands_survive_a_shell() {
        assert_eq!(shell_word("sqlite://demo.db"), "sqlite://demo.db");
        assert_eq!(shell_word("sqlite://my demo.db"), "'sqlite://my demo.db'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
