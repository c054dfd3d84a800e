//! A fake bot behind the gateway: the bot's own webhook on loopback. It records every request
//! (the exact body, the update and attempt headers, the secret it was shown), tracks how many
//! requests of one chat are in flight at once, and answers as the test sets it: 200, a status,
//! a JSON Bot API call, or slowly.

#![allow(
    dead_code,
    reason = "shared test support: each test uses a different part of it"
)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::task::JoinHandle;

/// How the bot answers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum BotMode {
    /// 200 with an empty body.
    #[default]
    Ok,
    /// This status (a bot that is failing).
    Status(u16),
    /// 200 with this JSON body (a Bot API call in the webhook answer).
    Answer(String),
    /// 200 after this long.
    Slow(Duration),
}

/// One request the bot received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Received {
    pub(crate) body: Vec<u8>,
    pub(crate) update_id: Option<i64>,
    pub(crate) attempt: Option<u32>,
    pub(crate) secret: Option<String>,
    /// The chat the body names (`message.chat.id`), if any.
    pub(crate) chat_id: Option<i64>,
    /// How the bot answered it.
    pub(crate) answered: u16,
}

#[derive(Debug, Default)]
struct BotState {
    mode: BotMode,
    received: Vec<Received>,
    in_flight: HashMap<i64, usize>,
    /// The most requests of one chat seen in flight at once.
    max_in_flight_per_chat: usize,
}

/// A running fake bot; it stops when dropped.
#[derive(Debug)]
pub(crate) struct FakeBot {
    addr: SocketAddr,
    state: Arc<Mutex<BotState>>,
    server: JoinHandle<()>,
}

impl Drop for FakeBot {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeBot {
    pub(crate) async fn start() -> FakeBot {
        let state = Arc::new(Mutex::new(BotState::default()));
        let app = Router::new()
            .route("/webhook", post(receive))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake bot to a loopback port");
        let addr = listener.local_addr().expect("the fake bot's address");
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("the fake bot serves");
        });
        FakeBot {
            addr,
            state,
            server,
        }
    }

    /// The `[bots.forward] url`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}/webhook", self.addr)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, BotState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_mode(&self, mode: BotMode) {
        self.state().mode = mode;
    }

    /// Every request, in the order received.
    pub(crate) fn received(&self) -> Vec<Received> {
        self.state().received.clone()
    }

    /// The requests it answered 2xx, in order.
    pub(crate) fn acknowledged(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| (200..300).contains(&r.answered))
            .collect()
    }

    pub(crate) fn max_in_flight_per_chat(&self) -> usize {
        self.state().max_in_flight_per_chat
    }
}

async fn receive(
    State(state): State<Arc<Mutex<BotState>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let chat_id = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.pointer("/message/chat/id")?.as_i64());
    let mode = {
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(chat) = chat_id {
            let now = state.in_flight.entry(chat).or_default();
            *now += 1;
            let now = *now;
            state.max_in_flight_per_chat = state.max_in_flight_per_chat.max(now);
        }
        state.mode.clone()
    };
    let (status, answer) = match mode {
        BotMode::Ok => (200, None),
        BotMode::Status(status) => (status, None),
        BotMode::Answer(json) => (200, Some(json)),
        BotMode::Slow(wait) => {
            tokio::time::sleep(wait).await;
            (200, None)
        }
    };
    {
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(chat) = chat_id {
            *state.in_flight.entry(chat).or_default() -= 1;
        }
        state.received.push(Received {
            body: body.to_vec(),
            update_id: header("x-opledger-update-id").and_then(|v| v.parse().ok()),
            attempt: header("x-opledger-attempt").and_then(|v| v.parse().ok()),
            secret: header("x-telegram-bot-api-secret-token"),
            chat_id,
            answered: status,
        });
    }
    let status = StatusCode::from_u16(status).expect("a valid status");
    match answer {
        Some(json) => (status, [(header::CONTENT_TYPE, "application/json")], json).into_response(),
        None => status.into_response(),
    }
}
