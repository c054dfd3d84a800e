//! A fake Telegram Bot API on loopback, for black-box tests: it serves `/bot{token}/{method}`
//! like Telegram does (long polling with offsets, webhook state, replies, callback answers, its
//! refusals), and records every call so that tests can assert what was sent.
//!
//! It understands JSON bodies only (what opledger sends), and methods case-insensitively, like
//! Telegram.

#![allow(
    dead_code,
    reason = "shared test support: each test binary uses a different part of it"
)]

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How the fake answers, so a test can provoke Telegram's refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum FakeMode {
    /// Answer like a healthy Telegram.
    #[default]
    Normal,
    /// `getUpdates` answers 409 "terminated by other getUpdates request", as when a second
    /// process polls with the same token; other methods work.
    Conflict,
    /// Every method answers 401, as after the token was revoked.
    Unauthorized,
    /// Every method answers 404 with the request's path (which holds the token) in its
    /// description, as some proxies in front of the Bot API do.
    NotFoundEchoingPath,
}

/// The webhook as the fake stores it after `setWebhook`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FakeWebhook {
    pub(crate) url: String,
    pub(crate) secret_token: Option<String>,
    pub(crate) allowed_updates: Option<Vec<String>>,
    pub(crate) max_connections: Option<u64>,
}

/// Called with the offset of every `getUpdates` that carries one, before the fake applies it
/// (forgets the updates below it) and answers: the moment Telegram would learn that those
/// updates are confirmed. The call waits for the returned future, so a test can look at the
/// world at that moment, or hold the call forever (a process that dies before its
/// confirmation arrives).
pub(crate) type OffsetHook =
    Arc<dyn Fn(i64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A running fake Bot API for one bot token. The server stops when this is dropped.
#[derive(Debug)]
pub(crate) struct FakeTelegram {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

struct Shared {
    token: String,
    state: Mutex<FakeState>,
    /// Woken whenever something a waiting long poll cares about changes: an update was pushed,
    /// a newer poll started, or the mode changed.
    changed: Notify,
    offset_hook: Mutex<Option<OffsetHook>>,
}

#[derive(Debug, Default)]
struct FakeState {
    mode: FakeMode,
    /// Every call with the right token, in order: method name as called, JSON body.
    calls: Vec<(String, Value)>,
    /// Calls with a wrong token.
    unauthorized_calls: usize,
    /// Unconfirmed updates in push order: `update_id` and exact bytes.
    queue: VecDeque<(i64, Vec<u8>)>,
    confirmed_offset: Option<i64>,
    /// Bumped by every `getUpdates`, so an older long poll knows it was superseded.
    poll_generation: u64,
    webhook: Option<FakeWebhook>,
    last_message_id: i64,
    /// `retry_after` seconds for the next `sendMessage` calls, answered with 429.
    send_message_retry_after: VecDeque<u64>,
    /// Errors (status, description) for the next `sendMessage` calls, after the 429s.
    send_message_errors: VecDeque<(StatusCode, String)>,
}

impl FakeTelegram {
    /// Starts the fake on `127.0.0.1:0`, serving the bot with `token`.
    pub(crate) async fn start(token: &str) -> FakeTelegram {
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            state: Mutex::new(FakeState::default()),
            changed: Notify::new(),
            offset_hook: Mutex::new(None),
        });
        let app = Router::new()
            .route("/{bot}/{method}", any(handle))
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake Bot API to a loopback port");
        let addr = listener.local_addr().expect("the fake's address");
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("the fake Bot API serves");
        });
        FakeTelegram {
            addr,
            shared,
            server,
        }
    }

    /// `http://127.0.0.1:PORT`, the Bot API base URL to configure.
    pub(crate) fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queues an update for `getUpdates`, waking a waiting long poll. The bytes are served
    /// exactly as given, so they must be one JSON object with an integer `update_id`.
    pub(crate) fn push_update(&self, body: impl Into<Vec<u8>>) {
        let body = body.into();
        let update_id = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("update_id").and_then(Value::as_i64))
            .expect("a pushed update is a JSON object with an integer update_id");
        self.shared.lock().queue.push_back((update_id, body));
        self.shared.changed.notify_waiters();
    }

    /// JSON bodies of the calls of `method` (case-insensitive), in order.
    pub(crate) fn calls(&self, method: &str) -> Vec<Value> {
        self.shared
            .lock()
            .calls
            .iter()
            .filter(|(called, _)| called.eq_ignore_ascii_case(method))
            .map(|(_, body)| body.clone())
            .collect()
    }

    /// Every call with the right token, in order: method name and JSON body.
    pub(crate) fn all_calls(&self) -> Vec<(String, Value)> {
        self.shared.lock().calls.clone()
    }

    /// Number of calls refused because of a wrong token.
    pub(crate) fn unauthorized_calls(&self) -> usize {
        self.shared.lock().unauthorized_calls
    }

    /// Highest positive `offset` any `getUpdates` passed: every update below it is confirmed.
    pub(crate) fn confirmed_offset(&self) -> Option<i64> {
        self.shared.lock().confirmed_offset
    }

    /// Updates pushed and not yet confirmed.
    pub(crate) fn pending_updates(&self) -> usize {
        self.shared.lock().queue.len()
    }

    /// Switches how the fake answers; waiting long polls notice at once.
    pub(crate) fn set_mode(&self, mode: FakeMode) {
        self.shared.lock().mode = mode;
        self.shared.changed.notify_waiters();
    }

    /// Makes the next `sendMessage` (after any already scripted) answer 429 with
    /// `parameters.retry_after = seconds`, without sending anything.
    pub(crate) fn script_send_message_retry_after(&self, seconds: u64) {
        self.shared
            .lock()
            .send_message_retry_after
            .push_back(seconds);
    }

    /// Makes the next `sendMessage` (after any already scripted) answer `status` with
    /// `description`, without sending anything.
    pub(crate) fn script_send_message_error(&self, status: StatusCode, description: &str) {
        self.shared
            .lock()
            .send_message_errors
            .push_back((status, description.to_owned()));
    }

    /// Installs the hook every `getUpdates` with an offset waits for (see [`OffsetHook`]).
    pub(crate) fn on_offset(&self, hook: OffsetHook) {
        *self
            .shared
            .offset_hook
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(hook);
    }

    /// The webhook set through `setWebhook`, if any.
    pub(crate) fn webhook(&self) -> Option<FakeWebhook> {
        self.shared.lock().webhook.clone()
    }
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        // A panicking test must not hide its own failure behind a poisoned lock.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FakeState {
    /// Telegram's confirmation: an offset confirms (forgets) every update with a lower id; a
    /// negative offset keeps only the last `-offset` updates and forgets the rest.
    fn apply_offset(&mut self, offset: i64) {
        if offset >= 0 {
            self.queue.retain(|(id, _)| *id >= offset);
            self.confirmed_offset = Some(self.confirmed_offset.map_or(offset, |o| o.max(offset)));
        } else {
            let keep = usize::try_from(offset.unsigned_abs()).unwrap_or(usize::MAX);
            while self.queue.len() > keep {
                self.queue.pop_front();
            }
        }
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    Path((bot, method)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    if bot.strip_prefix("bot") != Some(shared.token.as_str()) {
        shared.lock().unauthorized_calls += 1;
        return error(StatusCode::UNAUTHORIZED, "Unauthorized", None);
    }
    let body: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(value) => value,
            Err(_) => {
                return error(StatusCode::BAD_REQUEST, "Bad Request: invalid JSON", None);
            }
        }
    };
    {
        let mut state = shared.lock();
        state.calls.push((method.clone(), body.clone()));
        if state.mode == FakeMode::Unauthorized {
            return error(StatusCode::UNAUTHORIZED, "Unauthorized", None);
        }
        if state.mode == FakeMode::NotFoundEchoingPath {
            let description = format!("Not Found: POST /{bot}/{method} is not served here");
            return error(StatusCode::NOT_FOUND, &description, None);
        }
    }
    match method.to_ascii_lowercase().as_str() {
        "getupdates" => get_updates(&shared, &body).await,
        "setwebhook" => set_webhook(&shared, &body),
        "getwebhookinfo" => get_webhook_info(&shared),
        "deletewebhook" => delete_webhook(&shared, &body),
        "sendmessage" => send_message(&shared, &body),
        "answercallbackquery" => answer_callback_query(&body),
        "getme" => ok(&json!({
            "id": shared.token.split(':').next().and_then(|id| id.parse::<i64>().ok()).unwrap_or(1),
            "is_bot": true,
            "first_name": "Fake",
            "username": "fake_bot"
        })),
        _ => error(StatusCode::NOT_FOUND, "Not Found", None),
    }
}

async fn get_updates(shared: &Shared, body: &Value) -> Response {
    let offset = body.get("offset").and_then(Value::as_i64);
    let limit = body
        .get("limit")
        .and_then(Value::as_u64)
        .unwrap_or(100)
        .clamp(1, 100);
    let limit = usize::try_from(limit).expect("at most 100");
    let timeout = Duration::from_secs(body.get("timeout").and_then(Value::as_u64).unwrap_or(0));
    let deadline = tokio::time::Instant::now() + timeout;

    let hook = shared
        .offset_hook
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    if let (Some(hook), Some(offset)) = (hook, offset.filter(|o| *o >= 0)) {
        hook(offset).await;
    }
    let generation = {
        let mut state = shared.lock();
        if let Some(refusal) = polling_refusal(&state) {
            return refusal;
        }
        if let Some(offset) = offset {
            state.apply_offset(offset);
        }
        state.poll_generation += 1;
        state.poll_generation
    };
    // An older long poll still waiting is now superseded: let it answer 409, like Telegram.
    shared.changed.notify_waiters();

    loop {
        let changed = shared.changed.notified();
        tokio::pin!(changed);
        // Registered before looking at the queue, so a push in between is not missed.
        changed.as_mut().enable();
        {
            let state = shared.lock();
            if state.poll_generation != generation {
                return conflict_terminated();
            }
            if let Some(refusal) = polling_refusal(&state) {
                return refusal;
            }
            if !state.queue.is_empty() || tokio::time::Instant::now() >= deadline {
                let batch: Vec<&[u8]> = state
                    .queue
                    .iter()
                    .take(limit)
                    .map(|(_, bytes)| bytes.as_slice())
                    .collect();
                return ok_raw_array(&batch);
            }
        }
        // Either woken or at the deadline: the next turn answers in both cases.
        let _ = tokio::time::timeout_at(deadline, changed).await;
    }
}

/// Why Telegram would refuse `getUpdates` right now, if it would.
fn polling_refusal(state: &FakeState) -> Option<Response> {
    if state.mode == FakeMode::Conflict {
        return Some(conflict_terminated());
    }
    state.webhook.as_ref().map(|_| {
        error(
            StatusCode::CONFLICT,
            "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first",
            None,
        )
    })
}

fn conflict_terminated() -> Response {
    error(
        StatusCode::CONFLICT,
        "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
        None,
    )
}

fn set_webhook(shared: &Shared, body: &Value) -> Response {
    let url = body.get("url").and_then(Value::as_str).unwrap_or_default();
    let mut state = shared.lock();
    if body.get("drop_pending_updates").and_then(Value::as_bool) == Some(true) {
        state.queue.clear();
    }
    if url.is_empty() {
        // Telegram treats an empty URL as "remove the webhook".
        let description = if state.webhook.take().is_some() {
            "Webhook was deleted"
        } else {
            "Webhook is already deleted"
        };
        return ok_described(description);
    }
    state.webhook = Some(FakeWebhook {
        url: url.to_owned(),
        secret_token: body
            .get("secret_token")
            .and_then(Value::as_str)
            .map(str::to_owned),
        allowed_updates: body
            .get("allowed_updates")
            .and_then(Value::as_array)
            .map(|kinds| {
                kinds
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            }),
        max_connections: body.get("max_connections").and_then(Value::as_u64),
    });
    // Polls waiting now must learn that polling is no longer allowed.
    shared.changed.notify_waiters();
    ok_described("Webhook was set")
}

fn get_webhook_info(shared: &Shared) -> Response {
    let state = shared.lock();
    let pending = state.queue.len();
    match &state.webhook {
        None => ok(
            &json!({"url": "", "has_custom_certificate": false, "pending_update_count": pending}),
        ),
        Some(webhook) => {
            let mut info = json!({
                "url": webhook.url,
                "has_custom_certificate": false,
                "pending_update_count": pending,
                "max_connections": webhook.max_connections.unwrap_or(40),
                "ip_address": "127.0.0.1",
            });
            if let Some(kinds) = &webhook.allowed_updates {
                info["allowed_updates"] = json!(kinds);
            }
            ok(&info)
        }
    }
}

fn delete_webhook(shared: &Shared, body: &Value) -> Response {
    let mut state = shared.lock();
    if body.get("drop_pending_updates").and_then(Value::as_bool) == Some(true) {
        state.queue.clear();
    }
    let description = if state.webhook.take().is_some() {
        "Webhook was deleted"
    } else {
        "Webhook is already deleted"
    };
    ok_described(description)
}

fn send_message(shared: &Shared, body: &Value) -> Response {
    let Some(chat_id) = body
        .get("chat_id")
        .filter(|id| id.is_i64() || id.is_string())
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: chat_id is empty",
            None,
        );
    };
    let text = body.get("text").and_then(Value::as_str).unwrap_or_default();
    if text.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: message text is empty",
            None,
        );
    }
    let mut state = shared.lock();
    if let Some(seconds) = state.send_message_retry_after.pop_front() {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            &format!("Too Many Requests: retry after {seconds}"),
            Some(json!({"retry_after": seconds})),
        );
    }
    if let Some((status, description)) = state.send_message_errors.pop_front() {
        return error(status, &description, None);
    }
    state.last_message_id += 1;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    ok(&json!({
        "message_id": state.last_message_id,
        "from": {"id": 1, "is_bot": true, "first_name": "Fake", "username": "fake_bot"},
        "chat": {"id": chat_id, "type": "private"},
        "date": now,
        "text": text,
    }))
}

fn answer_callback_query(body: &Value) -> Response {
    if body
        .get("callback_query_id")
        .and_then(Value::as_str)
        .is_none()
    {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: query is too old and response timeout expired or query ID is invalid",
            None,
        );
    }
    ok(&json!(true))
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn ok(result: &Value) -> Response {
    json_response(
        StatusCode::OK,
        json!({"ok": true, "result": result})
            .to_string()
            .into_bytes(),
    )
}

fn ok_described(description: &str) -> Response {
    json_response(
        StatusCode::OK,
        json!({"ok": true, "result": true, "description": description})
            .to_string()
            .into_bytes(),
    )
}

/// `{"ok":true,"result":[...]}` with each update spliced in byte for byte.
fn ok_raw_array(updates: &[&[u8]]) -> Response {
    let mut body = b"{\"ok\":true,\"result\":[".to_vec();
    for (i, update) in updates.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(update);
    }
    body.extend_from_slice(b"]}");
    json_response(StatusCode::OK, body)
}

fn error(status: StatusCode, description: &str, parameters: Option<Value>) -> Response {
    let mut body = json!({
        "ok": false,
        "error_code": status.as_u16(),
        "description": description,
    });
    if let Some(parameters) = parameters {
        body["parameters"] = parameters;
    }
    json_response(status, body.to_string().into_bytes())
}
