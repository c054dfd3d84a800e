//! A fake Bot API on loopback for the example's tests: `getUpdates` from a queue (with
//! Telegram's offset rule, and forced redeliveries), `sendMessage` and the rest recorded.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::Notify;

#[derive(Debug, Default)]
struct Inner {
    pending: Vec<Value>,
    /// Served once more whatever the offset: Telegram delivering an update again.
    again: VecDeque<Value>,
    calls: Vec<(String, Value)>,
    next_message_id: i64,
}

#[derive(Debug, Clone)]
pub(crate) struct FakeBotApi {
    pub(crate) addr: SocketAddr,
    token: String,
    inner: Arc<(Mutex<Inner>, Notify)>,
}

impl FakeBotApi {
    pub(crate) async fn start(token: &str) -> FakeBotApi {
        let inner = Arc::new((Mutex::new(Inner::default()), Notify::new()));
        let fake = FakeBotApi {
            addr: "127.0.0.1:0".parse().expect("an address"),
            token: token.to_owned(),
            inner,
        };
        let app = Router::new()
            .route("/{bot}/{method}", post(handle))
            .with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake Bot API");
        let addr = listener.local_addr().expect("its address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeBotApi { addr, ..fake }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues an update for `getUpdates`.
    pub(crate) fn push(&self, update: Value) {
        self.lock().pending.push(update);
        self.inner.1.notify_waiters();
    }

    /// Serves `update` once more, even past the confirmed offset.
    pub(crate) fn deliver_again(&self, update: Value) {
        self.lock().again.push_back(update);
        self.inner.1.notify_waiters();
    }

    /// The bodies of the calls of `method` so far.
    pub(crate) fn calls(&self, method: &str) -> Vec<Value> {
        self.lock()
            .calls
            .iter()
            .filter(|(m, _)| m.eq_ignore_ascii_case(method))
            .map(|(_, body)| body.clone())
            .collect()
    }

    /// The texts sent with `sendMessage`.
    pub(crate) fn texts(&self) -> Vec<String> {
        self.calls("sendMessage")
            .iter()
            .map(|body| body["text"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

async fn handle(
    State(fake): State<FakeBotApi>,
    Path((bot, method)): Path<(String, String)>,
    body: Bytes,
) -> axum::Json<Value> {
    if bot.strip_prefix("bot") != Some(fake.token.as_str()) {
        return axum::Json(json!({"ok": false, "error_code": 401, "description": "Unauthorized"}));
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or_else(|_| json!({}));
    fake.lock().calls.push((method.clone(), body.clone()));
    let result = match method.to_ascii_lowercase().as_str() {
        "getme" => json!({
            "id": 1, "is_bot": true, "first_name": "Shop", "username": "shop_bot",
            "can_join_groups": true, "can_read_all_group_messages": false,
            "supports_inline_queries": false, "has_main_web_app": false
        }),
        "getupdates" => get_updates(&fake, &body).await,
        "sendmessage" => {
            let id = {
                let mut inner = fake.lock();
                inner.next_message_id += 1;
                inner.next_message_id
            };
            json!({
                "message_id": id, "date": 1_700_000_000,
                "chat": {"id": body["chat_id"], "type": "private", "first_name": "Ann"},
                "text": body["text"]
            })
        }
        _ => json!(true),
    };
    axum::Json(json!({"ok": true, "result": result}))
}

async fn get_updates(fake: &FakeBotApi, body: &Value) -> Value {
    let offset = body["offset"].as_i64().unwrap_or(0);
    let wait =
        Duration::from_secs(body["timeout"].as_u64().unwrap_or(0)).min(Duration::from_secs(1));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let notified = fake.inner.1.notified();
        {
            let mut inner = fake.lock();
            inner
                .pending
                .retain(|u| u["update_id"].as_i64().unwrap_or(0) >= offset);
            let mut batch: Vec<Value> = inner.again.drain(..).collect();
            batch.extend(inner.pending.iter().cloned());
            if !batch.is_empty() {
                return Value::Array(batch);
            }
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return json!([]);
        }
    }
}

/// A private chat's text message from user 42.
pub(crate) fn message(update_id: i64, text: &str) -> Value {
    let command = text.split_whitespace().next().unwrap_or_default();
    let entities = if command.starts_with('/') {
        json!([{"type": "bot_command", "offset": 0, "length": command.encode_utf16().count()}])
    } else {
        json!([])
    };
    json!({
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": 1_700_000_000,
            "chat": {"id": 42, "type": "private", "first_name": "Ann"},
            "from": {"id": 42, "is_bot": false, "first_name": "Ann"},
            "text": text,
            "entities": entities
        }
    })
}

/// User 42's click on a button with `data`.
pub(crate) fn click(update_id: i64, data: &str) -> Value {
    json!({
        "update_id": update_id,
        "callback_query": {
            "id": format!("cq-{update_id}"),
            "from": {"id": 42, "is_bot": false, "first_name": "Ann"},
            "chat_instance": "ci-42",
            "data": data,
            "message": {
                "message_id": 1, "date": 1_700_000_000,
                "chat": {"id": 42, "type": "private", "first_name": "Ann"},
                "text": "Issue a coupon?"
            }
        }
    })
}
