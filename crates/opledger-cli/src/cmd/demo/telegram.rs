//! The demo's Telegram, on loopback: it delivers updates to opledger's webhook the way Telegram
//! does (a POST with the secret header, the answer read as a Bot API call), serves the Bot API
//! methods opledger calls (`/bot{token}/{method}`), and keeps everything it received, so that the
//! demo can show what the user would have seen.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;
use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::{Value, json};

/// One thing Telegram received from opledger: a Bot API call, or a method carried in a
/// webhook's answer (`answerCallbackQuery` for a click, `sendMessage` for `/status`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Received {
    pub(super) method: String,
    pub(super) chat_id: Option<i64>,
    /// The message's text or the click's notice, when there is one.
    pub(super) text: Option<String>,
    /// Whether it came as a webhook's answer rather than a call.
    pub(super) in_webhook_answer: bool,
}

impl Received {
    fn from_body(method: &str, body: &Value, in_webhook_answer: bool) -> Received {
        Received {
            method: method.to_owned(),
            chat_id: body.get("chat_id").and_then(Value::as_i64),
            text: body.get("text").and_then(Value::as_str).map(str::to_owned),
            in_webhook_answer,
        }
    }
}

/// What a webhook delivery was answered with.
#[derive(Debug, Clone)]
pub(super) struct Delivered {
    pub(super) status: StatusCode,
    /// The method the answer carried, if any.
    pub(super) answer: Option<Received>,
}

/// Where and how to deliver updates: the bot's webhook URL and its secret.
#[derive(Debug, Clone)]
pub(super) struct Webhook {
    pub(super) url: String,
    pub(super) secret: String,
}

/// A running fake Telegram for one bot token; it stops with the demo's runtime.
#[derive(Debug)]
pub(super) struct FakeTelegram {
    addr: SocketAddr,
    shared: Arc<Shared>,
    http: reqwest::Client,
}

#[derive(Debug)]
struct Shared {
    token: String,
    received: Mutex<Vec<Received>>,
    deliveries: AtomicUsize,
}

impl Shared {
    fn keep(&self, received: Received) {
        self.received
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(received);
    }
}

impl FakeTelegram {
    /// Serves the Bot API for `token` on `127.0.0.1` at a port the system picks.
    pub(super) async fn start(token: &str) -> anyhow::Result<FakeTelegram> {
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            received: Mutex::new(Vec::new()),
            deliveries: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/{bot}/{method}", post(method))
            .with_state(Arc::clone(&shared));
        let addr = super::serve_locally(app, "Telegram").await?;
        Ok(FakeTelegram {
            addr,
            shared,
            http: reqwest::Client::new(),
        })
    }

    /// `http://127.0.0.1:PORT`, the bot's `api_base_url`.
    pub(super) fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Delivers one update's exact bytes to the webhook, as Telegram does, and keeps the method
    /// its answer carries.
    pub(super) async fn deliver(
        &self,
        webhook: &Webhook,
        update: &[u8],
    ) -> anyhow::Result<Delivered> {
        self.shared.deliveries.fetch_add(1, Ordering::Relaxed);
        let response = self
            .http
            .post(&webhook.url)
            .header(opledger_server::SECRET_HEADER, &webhook.secret)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(update.to_vec())
            .send()
            .await
            .context("the webhook did not answer the demo's Telegram")?;
        let status = response.status();
        let body = response.bytes().await.unwrap_or_default();
        let answer = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|body| {
                let method = body.get("method")?.as_str()?.to_owned();
                Some(Received::from_body(&method, &body, true))
            });
        if let Some(answer) = &answer {
            self.shared.keep(answer.clone());
        }
        Ok(Delivered { status, answer })
    }

    /// How many updates it delivered, repeats included.
    pub(super) fn deliveries(&self) -> usize {
        self.shared.deliveries.load(Ordering::Relaxed)
    }

    /// Everything received so far, in order.
    pub(super) fn received(&self) -> Vec<Received> {
        self.shared
            .received
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A Bot API call: kept, and answered as Telegram answers it. A wrong token is refused, as
/// Telegram does.
async fn method(
    State(shared): State<Arc<Shared>>,
    Path((bot, method)): Path<(String, String)>,
    body: Option<Json<Value>>,
) -> (StatusCode, Json<Value>) {
    if bot.strip_prefix("bot") != Some(shared.token.as_str()) {
        let refusal = json!({"ok": false, "error_code": 401, "description": "Unauthorized"});
        return (StatusCode::UNAUTHORIZED, Json(refusal));
    }
    let body = body.map(|Json(body)| body).unwrap_or(Value::Null);
    let received = Received::from_body(&method, &body, false);
    let result = if method.eq_ignore_ascii_case("sendMessage") {
        let message_id = shared
            .received
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        json!({
            "message_id": message_id + 1,
            "date": chrono::Utc::now().timestamp(),
            "chat": {"id": received.chat_id, "type": "private"},
            "text": received.text,
        })
    } else {
        Value::Bool(true)
    };
    shared.keep(received);
    (StatusCode::OK, Json(json!({"ok": true, "result": result})))
}

/// A private message from `user` (in their chat with the bot) with `text`, as Telegram sends it.
pub(super) fn message(update_id: i64, user: i64, text: &str) -> Vec<u8> {
    let command = text.split_whitespace().next().unwrap_or_default();
    json!({
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": chrono::Utc::now().timestamp(),
            "chat": {"id": user, "type": "private"},
            "from": {"id": user, "is_bot": false, "first_name": super::USER_NAME},
            "text": text,
            "entities": [{"type": "bot_command", "offset": 0, "length": command.encode_utf16().count()}],
        }
    })
    .to_string()
    .into_bytes()
}

/// A click by `user` on an inline button carrying `data`.
pub(super) fn click(update_id: i64, user: i64, data: &str) -> Vec<u8> {
    json!({
        "update_id": update_id,
        "callback_query": {
            "id": format!("click-{update_id}"),
            "from": {"id": user, "is_bot": false, "first_name": super::USER_NAME},
            "chat_instance": "demo",
            "message": {
                "message_id": 1,
                "date": chrono::Utc::now().timestamp(),
                "chat": {"id": user, "type": "private"},
            },
            "data": data,
        }
    })
    .to_string()
    .into_bytes()
}
