//! A small teloxide bot that embeds opledger (walked through in `docs/adopt.md`).
//!
//! - `/coupon CAMPAIGN` issues a coupon from the "shop" (a JSON-lines file, in process) through
//!   the ledger's `coupon` action, at most once per user and campaign, and answers with it.
//! - `/gift CAMPAIGN` answers with a one-time *Confirm* button; the first click starts the
//!   same action, and opledger's worker sends the reply.
//! - `/status` is answered by opledger from the ledger.
//!
//! Every update reaches the handler once it is recorded; a redelivery from Telegram never
//! does, and an update whose handling was cut short (the process was killed) is handled
//! again, which is safe because the coupon is an action.
//!
//! Settings, from the environment: `BOT_TOKEN` (required), `LEDGER_URL` (default
//! `sqlite://teloxide-bot.db`), `COUPONS_FILE` (default `coupons.jsonl`), `TELEGRAM_API_URL`
//! (default Telegram's), `WEBHOOK_LISTEN` and `WEBHOOK_SECRET` (webhook mode: opledger's routes
//! are served there, `/telegram/shop/webhook` among them; polling without them),
//! `SHOP_DELAY_MS` (the shop answers this much later after issuing a coupon: a slow shop).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use opledger::{
    Action, Bot, CallOutcome, EffectRequest, Opledger, Submit, Success, Updates, effect_fn,
};
use serde_json::{Value, json};
use teloxide::prelude::*;
use teloxide::types::{InlineKeyboardButton, InlineKeyboardMarkup};
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

/// The bot's name in the ledger.
const BOT: &str = "shop";
/// How long a handler waits for a coupon before it answers that it is on its way.
const WAIT: Duration = Duration::from_secs(8);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let setting = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let token = setting("BOT_TOKEN").context("set BOT_TOKEN to the bot's token")?;
    let ledger_url = setting("LEDGER_URL").unwrap_or_else(|| "sqlite://teloxide-bot.db".into());
    let shop = Shop {
        file: setting("COUPONS_FILE").map_or_else(|| "coupons.jsonl".into(), PathBuf::from),
        delay: setting("SHOP_DELAY_MS")
            .map(|ms| {
                ms.parse()
                    .context("SHOP_DELAY_MS is a number of milliseconds")
            })
            .transpose()?
            .map(Duration::from_millis),
        lock: Arc::new(Mutex::new(())),
    };
    let api_url = setting("TELEGRAM_API_URL");
    let webhook = match (setting("WEBHOOK_LISTEN"), setting("WEBHOOK_SECRET")) {
        (Some(listen), Some(secret)) => Some((listen, secret)),
        (None, None) => None,
        _ => anyhow::bail!("set both WEBHOOK_LISTEN and WEBHOOK_SECRET, or neither (polling)"),
    };

    let mut bot = match &webhook {
        Some((_, secret)) => Bot::webhook(BOT, token.clone(), secret.clone()),
        None => Bot::polling(BOT, token.clone()).poll_timeout(Duration::from_secs(1)),
    }
    .handlers(Updates::Unhandled)
    .handler_timeout(Duration::from_secs(10));
    if let Some(url) = &api_url {
        bot = bot.api_base_url(url.clone());
    }
    let coupon = Action::new("coupon", BOT)
        .params(["campaign"])
        .key("{user_id}:{campaign}")
        .reply_confirmed("Your coupon for {campaign}: {external_id}");
    let ledger = Opledger::builder()
        .ledger(&ledger_url)
        .bot(bot)
        .action(coupon)
        .effector(
            "coupon",
            effect_fn(move |request| {
                let shop = shop.clone();
                async move { shop.issue(request).await }
            })
            .honours_idempotency_key()
            .timeout(Duration::from_secs(5)),
        )
        .lease_margin(Duration::from_secs(1))
        .open()
        .await?;

    let (listener, handler) = opledger::teloxide::dispatching(&ledger, BOT, schema())?;
    let running = ledger.start().await?;
    let server = match &webhook {
        Some((listen, _)) => {
            let tcp = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("cannot listen on {listen} (WEBHOOK_LISTEN)"))?;
            let routes = ledger.router();
            Some(tokio::spawn(async move { axum::serve(tcp, routes).await }))
        }
        None => None,
    };
    println!(
        "teloxide-bot: {} with the ledger {ledger_url}",
        match &webhook {
            Some((listen, _)) => format!("webhook at http://{listen}/telegram/{BOT}/webhook"),
            None => "long polling".to_owned(),
        }
    );

    let mut telegram = teloxide::Bot::new(token);
    if let Some(url) = api_url {
        telegram = telegram.set_api_url(url.parse().context("TELEGRAM_API_URL is a URL")?);
    }
    Dispatcher::builder(telegram, handler)
        .dependencies(dptree::deps![ledger.clone()])
        .enable_ctrlc_handler()
        .build()
        .dispatch_with_listener(
            listener,
            LoggingErrorHandler::with_custom_text("the ledger's update source failed"),
        )
        .await;
    if let Some(server) = server {
        server.abort();
    }
    running.shutdown().await;
    Ok(())
}

/// The bot's handlers: text commands; the rest is opledger's (`/status`, button clicks).
fn schema() -> teloxide::dispatching::UpdateHandler<teloxide::RequestError> {
    Update::filter_message().endpoint(on_message)
}

async fn on_message(
    telegram: teloxide::Bot,
    ledger: Opledger,
    update: Update,
    message: Message,
) -> ResponseResult<()> {
    let (Some(text), Some(user)) = (message.text(), message.from.as_ref()) else {
        return Ok(());
    };
    let user_id = i64::try_from(user.id.0).unwrap_or(i64::MAX);
    let mut words = text.split_whitespace();
    let answer = match (words.next(), words.next()) {
        (Some("/coupon"), Some(campaign)) => {
            let submit = Submit::new(BOT, "coupon")
                .param("campaign", campaign)
                .user(user_id)
                .update(i64::from(update.id.0));
            match ledger.run(submit, WAIT).await {
                Ok(outcome) if outcome.is_confirmed() => format!(
                    "Your coupon for {campaign}: {}",
                    outcome.operation.external_id.unwrap_or_default()
                ),
                Ok(outcome) if outcome.is_settled() => format!(
                    "Sorry, no coupon for {campaign}: {}",
                    outcome.operation.last_error.unwrap_or_default()
                ),
                Ok(_) => format!("Your coupon for {campaign} is on its way; ask /status later."),
                Err(error) => {
                    tracing::warn!(%error, "cannot issue a coupon now");
                    "Sorry, I cannot issue coupons right now; try again in a minute.".to_owned()
                }
            }
        }
        (Some("/gift"), Some(campaign)) => {
            let params = BTreeMap::from([("campaign".to_owned(), campaign.to_owned())]);
            let chat = Some(message.chat.id.0);
            let valid_for = Duration::from_secs(600);
            match ledger
                .button(BOT, "coupon", user_id, chat, params, valid_for)
                .await
            {
                Ok(token) => {
                    let keyboard = InlineKeyboardMarkup::new([[InlineKeyboardButton::callback(
                        "Confirm", token,
                    )]]);
                    telegram
                        .send_message(message.chat.id, format!("Issue a coupon for {campaign}?"))
                        .reply_markup(keyboard)
                        .await?;
                    return Ok(());
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot issue a button now");
                    "Sorry, try again in a minute.".to_owned()
                }
            }
        }
        _ => "Send /coupon CAMPAIGN for a coupon, /gift CAMPAIGN to confirm first, or /status."
            .to_owned(),
    };
    telegram.send_message(message.chat.id, answer).await?;
    Ok(())
}

/// The shop: coupons in a JSON-lines file, one per operation id (the idempotency key): asked
/// again for an operation it has served, it answers the same coupon and issues none.
#[derive(Debug, Clone)]
struct Shop {
    file: PathBuf,
    delay: Option<Duration>,
    lock: Arc<Mutex<()>>,
}

impl Shop {
    async fn issue(&self, request: EffectRequest) -> CallOutcome {
        let issued = {
            let _one_at_a_time = self.lock.lock().await;
            match self.find_or_issue(&request).await {
                Ok(issued) => issued,
                Err(error) => {
                    return CallOutcome::Unknown {
                        reason: format!("the shop's file: {error}"),
                    };
                }
            }
        };
        if let (true, Some(delay)) = (issued.new, self.delay) {
            tokio::time::sleep(delay).await;
        }
        CallOutcome::Succeeded(Success {
            external_id: Some(issued.code),
            ..Success::default()
        })
    }

    async fn find_or_issue(&self, request: &EffectRequest) -> std::io::Result<Issued> {
        let existing = match tokio::fs::read_to_string(&self.file).await {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(error) => return Err(error),
        };
        for line in existing.lines() {
            let Ok(coupon) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if coupon["operation_id"] == request.operation_id.as_str() {
                let code = coupon["code"].as_str().unwrap_or_default().to_owned();
                return Ok(Issued { code, new: false });
            }
        }
        let campaign = request.params.get("campaign").map_or("", String::as_str);
        let code = format!(
            "{}-{}",
            campaign.to_uppercase(),
            &request.operation_id[..8.min(request.operation_id.len())]
        );
        let line = json!({
            "operation_id": request.operation_id,
            "user_id": request.user_id,
            "campaign": campaign,
            "code": code,
        });
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.file)
            .await?;
        file.write_all(format!("{line}\n").as_bytes()).await?;
        file.sync_data().await?;
        Ok(Issued { code, new: true })
    }
}

#[derive(Debug)]
struct Issued {
    code: String,
    new: bool,
}
