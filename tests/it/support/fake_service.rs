//! A fake external service on loopback (a coupon shop, also serving leads as a CRM would), for
//! the worker's tests: it counts
//! requests per `Idempotency-Key`, performs "creations", serves a lookup by reference, and
//! answers as each test scripts it (refusals, overload, acting and then hanging, 5xx).

#![allow(
    dead_code,
    reason = "shared test support: each test uses a different part of it"
)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// How the service answers one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Behaviour {
    /// Creates the coupon and answers 201 with it.
    Create,
    /// Answers this status without doing anything (with `Retry-After` when given).
    Refuse {
        status: u16,
        retry_after: Option<u64>,
    },
    /// Creates the coupon, then keeps the connection without answering for this long (the
    /// client times out: the outcome is unknown to it).
    CreateThenHang(Duration),
    /// Creates the coupon, then answers this 5xx.
    CreateThenFail(u16),
    /// Hangs without doing anything.
    Hang(Duration),
    /// Answers this status with this JSON body, byte for byte, without creating anything (an
    /// answer the test writes itself, e.g. one a backend cannot store).
    Answer { status: u16, body: String },
}

/// How the lookup endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum LookupMode {
    /// 200 with the coupon if one was created under the reference, 404 otherwise.
    #[default]
    Honest,
    /// 500 to every lookup.
    Broken,
}

#[derive(Debug, Default)]
struct ServiceState {
    /// Scripted answers, used in order; `Create` when empty.
    script: VecDeque<Behaviour>,
    /// Requests per idempotency key (every POST, whatever the answer).
    requests: HashMap<String, usize>,
    /// Coupons created per key: the side effects that count.
    creations: HashMap<String, usize>,
    /// The coupon per key, for answers and lookups.
    coupons: HashMap<String, Value>,
    /// The last body per key.
    bodies: HashMap<String, Value>,
    lookups: usize,
    lookup: LookupMode,
    /// Whether a repeated key returns the first coupon instead of creating another.
    honours_key: bool,
    next_code: u64,
}

/// A running fake service. It stops when dropped.
#[derive(Debug)]
pub(crate) struct FakeService {
    addr: SocketAddr,
    state: Arc<Mutex<ServiceState>>,
    server: JoinHandle<()>,
}

impl Drop for FakeService {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeService {
    /// Starts the service on `127.0.0.1:0`; `honours_key` decides whether it deduplicates
    /// requests by `Idempotency-Key`.
    pub(crate) async fn start(honours_key: bool) -> FakeService {
        Self::start_on("127.0.0.1:0", honours_key).await
    }

    /// Starts the service on a given address (to come back on the same port).
    pub(crate) async fn start_on(address: &str, honours_key: bool) -> FakeService {
        let state = Arc::new(Mutex::new(ServiceState {
            honours_key,
            ..ServiceState::default()
        }));
        let app = Router::new()
            .route("/coupons", post(create))
            .route("/coupons/by-reference/{key}", get(lookup))
            .route("/leads", post(create))
            .route("/leads/by-reference/{key}", get(lookup))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .expect("bind the fake service to a loopback port");
        let addr = listener.local_addr().expect("the fake service's address");
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("the fake service serves");
        });
        FakeService {
            addr,
            state,
            server,
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The `[actions.effector]` URL.
    pub(crate) fn url(&self) -> String {
        format!("http://{}/coupons", self.addr)
    }

    /// The lookup URL template.
    pub(crate) fn lookup_url(&self) -> String {
        format!("http://{}/coupons/by-reference/{{operation_id}}", self.addr)
    }

    /// The `[actions.effector]` URL of the service as a CRM taking leads (the same counts).
    pub(crate) fn leads_url(&self) -> String {
        format!("http://{}/leads", self.addr)
    }

    /// The lookup URL template of the service as a CRM.
    pub(crate) fn leads_lookup_url(&self) -> String {
        format!("http://{}/leads/by-reference/{{operation_id}}", self.addr)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ServiceState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues answers for the next requests, in order.
    pub(crate) fn script(&self, behaviours: impl IntoIterator<Item = Behaviour>) {
        self.state().script.extend(behaviours);
    }

    pub(crate) fn set_lookup(&self, mode: LookupMode) {
        self.state().lookup = mode;
    }

    /// Requests per idempotency key.
    pub(crate) fn requests(&self) -> HashMap<String, usize> {
        self.state().requests.clone()
    }

    /// All POSTs received.
    pub(crate) fn total_requests(&self) -> usize {
        self.state().requests.values().sum()
    }

    /// Creations per idempotency key.
    pub(crate) fn creations(&self) -> HashMap<String, usize> {
        self.state().creations.clone()
    }

    pub(crate) fn lookups(&self) -> usize {
        self.state().lookups
    }

    /// The last JSON body received under `key`.
    pub(crate) fn body(&self, key: &str) -> Option<Value> {
        self.state().bodies.get(key).cloned()
    }

    /// The coupon created under `key`.
    pub(crate) fn coupon(&self, key: &str) -> Option<Value> {
        self.state().coupons.get(key).cloned()
    }
}

async fn create(
    State(state): State<Arc<Mutex<ServiceState>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return (StatusCode::BAD_REQUEST, "missing Idempotency-Key").into_response();
    };
    let (behaviour, coupon) = {
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        *state.requests.entry(key.clone()).or_default() += 1;
        if let Ok(value) = serde_json::from_slice(&body) {
            state.bodies.insert(key.clone(), value);
        }
        let behaviour = state.script.pop_front().unwrap_or(Behaviour::Create);
        let acts = matches!(
            behaviour,
            Behaviour::Create | Behaviour::CreateThenHang(_) | Behaviour::CreateThenFail(_)
        );
        let coupon = if acts {
            match state.coupons.get(&key).cloned() {
                Some(existing) if state.honours_key => Some(existing),
                _ => {
                    state.next_code += 1;
                    let coupon = json!({
                        "id": format!("cpn_{}", state.next_code),
                        "code": format!("SAVE-{}", state.next_code),
                        "reference": key,
                    });
                    *state.creations.entry(key.clone()).or_default() += 1;
                    state.coupons.insert(key.clone(), coupon.clone());
                    Some(coupon)
                }
            }
        } else {
            None
        };
        (behaviour, coupon)
    };
    match behaviour {
        Behaviour::Create => (
            StatusCode::CREATED,
            [(header::CONTENT_TYPE, "application/json")],
            coupon.unwrap_or(Value::Null).to_string(),
        )
            .into_response(),
        Behaviour::Refuse {
            status,
            retry_after,
        } => {
            let status = StatusCode::from_u16(status).expect("a valid status");
            let mut response = (status, "refused").into_response();
            if let Some(seconds) = retry_after {
                response.headers_mut().insert(
                    header::RETRY_AFTER,
                    seconds.to_string().parse().expect("a header value"),
                );
            }
            response
        }
        Behaviour::CreateThenHang(wait) | Behaviour::Hang(wait) => {
            tokio::time::sleep(wait).await;
            (
                StatusCode::CREATED,
                coupon.unwrap_or(Value::Null).to_string(),
            )
                .into_response()
        }
        Behaviour::CreateThenFail(status) => (
            StatusCode::from_u16(status).expect("a valid status"),
            "oops",
        )
            .into_response(),
        Behaviour::Answer { status, body } => (
            StatusCode::from_u16(status).expect("a valid status"),
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
    }
}

async fn lookup(
    State(state): State<Arc<Mutex<ServiceState>>>,
    Path(key): Path<String>,
) -> Response {
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    state.lookups += 1;
    if state.lookup == LookupMode::Broken {
        return (StatusCode::INTERNAL_SERVER_ERROR, "lookup broken").into_response();
    }
    match state.coupons.get(&key) {
        Some(coupon) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            coupon.to_string(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such reference").into_response(),
    }
}
