//! The demo's shop, on loopback: `POST /coupons` issues a coupon for every request it gets and
//! keeps its own record of what it issued. It does not deduplicate on the `Idempotency-Key`
//! (like many real services), so only opledger stands between a repeat and a second coupon.
//! Told to [`FakeShop::stall_next`], it issues the next coupon but answers too late: the
//! caller cannot know whether a coupon exists.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::{Value, json};

/// How long a stalled answer takes: far beyond the demo's effector timeout.
const STALL: Duration = Duration::from_secs(30);

/// A coupon the shop issued, as its own records have it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Coupon {
    /// The shop's id for it, answered as `id`.
    pub(crate) id: String,
    /// What the customer types at checkout, answered as `code`.
    pub(crate) code: String,
    /// The request's `Idempotency-Key` header: opledger's operation id.
    pub(crate) idempotency_key: String,
    /// The business key the request carried.
    pub(crate) business_key: String,
    /// Whether the shop's answer was sent in time (false for a stalled one).
    pub(crate) answered: bool,
}

/// A running fake shop; it stops with the demo's runtime.
#[derive(Debug)]
pub(super) struct FakeShop {
    addr: SocketAddr,
    state: Arc<Mutex<ShopState>>,
}

#[derive(Debug, Default)]
struct ShopState {
    coupons: Vec<Coupon>,
    stall_next: bool,
}

impl FakeShop {
    /// Serves the shop on `127.0.0.1` at a port the system picks.
    pub(super) async fn start() -> anyhow::Result<FakeShop> {
        let state = Arc::new(Mutex::new(ShopState::default()));
        let app = Router::new()
            .route("/coupons", post(issue))
            .with_state(Arc::clone(&state));
        let addr = super::serve_locally(app, "shop").await?;
        Ok(FakeShop { addr, state })
    }

    /// The effector URL: `http://127.0.0.1:PORT/coupons`.
    pub(super) fn coupons_url(&self) -> String {
        format!("http://{}/coupons", self.addr)
    }

    /// The next request is served (a coupon issued) but answered only after [`STALL`].
    pub(super) fn stall_next(&self) {
        self.lock().stall_next = true;
    }

    /// Every coupon issued so far, in order.
    pub(super) fn coupons(&self) -> Vec<Coupon> {
        self.lock().coupons.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ShopState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

async fn issue(
    State(state): State<Arc<Mutex<ShopState>>>,
    headers: HeaderMap,
    Json(request): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let text = |value: Option<&Value>| value.and_then(Value::as_str).unwrap_or("").to_owned();
    let campaign = text(request.get("params").and_then(|p| p.get("campaign")));
    let (coupon, stall) = {
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        let stall = std::mem::take(&mut state.stall_next);
        let number = state.coupons.len() + 1;
        let coupon = Coupon {
            id: format!("cpn_{number}"),
            code: format!("{}-{number:04}", campaign.to_ascii_uppercase()),
            // A key that is missing or not text is kept as empty: the demo's checks then fail.
            idempotency_key: headers
                .get(opledger_worker::IDEMPOTENCY_KEY)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            business_key: text(request.get("business_key")),
            answered: !stall,
        };
        state.coupons.push(coupon.clone());
        (coupon, stall)
    };
    if stall {
        tokio::time::sleep(STALL).await;
    }
    let answer = json!({"id": coupon.id, "code": coupon.code});
    (StatusCode::CREATED, Json(answer))
}
