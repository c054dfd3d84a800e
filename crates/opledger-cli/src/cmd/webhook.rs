//! `opledger webhook`: tell Telegram where to deliver a bot's updates, and ask how delivery goes.
//! Every call goes to the bot's configured `api_base_url`; the bot token is never printed.

use anyhow::Context;
use opledger_config::{BotConfig, BotMode, Config};
use opledger_telegram::{BotApi, SetWebhook};

use crate::output::{escape, timestamp};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Webhook {
    /// Point Telegram at this service's webhook (setWebhook), with the bot's secret token and
    /// the update kinds opledger handles.
    Set {
        /// The bot's name in the configuration.
        #[arg(long)]
        bot: String,
        /// The public HTTPS URL that reaches /telegram/{bot}/webhook (Telegram accepts ports 443,
        /// 80, 88 and 8443).
        #[arg(long)]
        url: String,
        /// Drop the updates Telegram still holds for the bot. They are users' actions: only on
        /// purpose.
        #[arg(long)]
        drop_pending_updates: bool,
    },
    /// Show what Telegram knows of the bot's webhook (getWebhookInfo): pending updates, last
    /// error.
    Info {
        /// The bot's name in the configuration.
        #[arg(long)]
        bot: String,
    },
    /// Print a fresh random secret token for `webhook_secret_env` (256 bits, Telegram's
    /// alphabet).
    Secret,
}

impl Webhook {
    pub(crate) async fn run(self, config: &Config) -> anyhow::Result<()> {
        match self {
            Webhook::Set {
                bot,
                url,
                drop_pending_updates,
            } => {
                let bot = find(config, &bot)?;
                let Some(secret) = bot.webhook_secret.clone() else {
                    anyhow::bail!(
                        "bot `{}` has no webhook secret: set mode = \"webhook\" and \
                         webhook_secret_env in its [[bots]] section",
                        bot.name
                    );
                };
                let request = SetWebhook {
                    url: url.clone(),
                    secret_token: secret,
                    allowed_updates: opledger_server::allowed_updates(),
                    max_connections: Some(u32::from(bot.max_connections)),
                    drop_pending_updates,
                };
                api(config, bot)?
                    .set_webhook(&request)
                    .await
                    .context("setWebhook failed")?;
                println!(
                    "bot {}: Telegram now delivers {} to {url} with the secret from {}",
                    bot.name,
                    opledger_server::allowed_updates().join(", "),
                    bot.webhook_secret_env
                        .as_deref()
                        .unwrap_or("the configuration")
                );
                if bot.mode == BotMode::Poll {
                    println!(
                        "note: bot {} is configured for long polling; Telegram refuses getUpdates \
                         while a webhook is set",
                        bot.name
                    );
                }
                Ok(())
            }
            Webhook::Info { bot } => {
                let bot = find(config, &bot)?;
                let info = api(config, bot)?
                    .get_webhook_info()
                    .await
                    .context("getWebhookInfo failed")?;
                let url = if info.url.is_empty() {
                    "(none: long polling or not set)"
                } else {
                    info.url.as_str()
                };
                // Telegram's answer is text from outside: escaped like every listing.
                println!("url: {}", escape(url));
                println!("pending_update_count: {}", info.pending_update_count);
                if let Some(at) = info.last_error_date {
                    println!(
                        "last_error: {} at {}",
                        escape(info.last_error_message.as_deref().unwrap_or("(no message)")),
                        timestamp(at)
                    );
                } else {
                    println!("last_error: none");
                }
                if let Some(max) = info.max_connections {
                    println!("max_connections: {max}");
                }
                if let Some(allowed) = &info.allowed_updates {
                    println!("allowed_updates: {}", escape(&allowed.join(", ")));
                }
                Ok(())
            }
            Webhook::Secret => {
                let random = uuid::Uuid::new_v4().simple().to_string()
                    + &uuid::Uuid::new_v4().simple().to_string();
                println!("{random}");
                Ok(())
            }
        }
    }
}

fn find<'a>(config: &'a Config, name: &str) -> anyhow::Result<&'a BotConfig> {
    config.bot(name).with_context(|| {
        let known: Vec<&str> = config.bots.iter().map(|b| b.name.as_str()).collect();
        if known.is_empty() {
            format!("no bot named `{name}`: the configuration has no [[bots]]; pass --config")
        } else {
            format!(
                "no bot named `{name}`; configured bots: {}",
                known.join(", ")
            )
        }
    })
}

/// The bot's client, scrubbing every configured secret from what Telegram answers (ADR 0011).
fn api(config: &Config, bot: &BotConfig) -> anyhow::Result<BotApi> {
    Ok(
        BotApi::new(&bot.api_base_url, bot.token.clone(), BotApi::http_client()?)?
            .redacting(&config.redactor()),
    )
}
