//! The service: one axum router for webhook intake and health, long-polling loops for bots in
//! poll mode, and the shutdown protocol. Built once from configuration and a store by
//! [`App::build`], the entry point of `main` and of the black-box tests alike.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::MatchedPath;
use axum::http::{Request, StatusCode};
use axum::routing::{get, post};
use opledger_config::{ActionConfig, BotMode, Config};
use opledger_store::AnyStore;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::api::ApiTokens;
use crate::edge::{self, Edge};
use crate::intake::{Intake, Recorded};
use crate::replies::{self, Answer};
use crate::webhook::{self, WebhookSecret};
use crate::{api, health, metrics, poll, refusals};
use opledger_ledger::{Clock, SystemClock};

/// Counts the service keeps for operators since it started, exported by `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub rejected_secrets: AtomicU64,
    pub accepted: AtomicU64,
    pub duplicates: AtomicU64,
    pub collisions: AtomicU64,
    pub quarantined: AtomicU64,
    /// Read API requests refused for a missing or wrong admin token.
    pub rejected_admin_tokens: AtomicU64,
}

/// What every request handler and poller shares.
#[derive(Debug)]
pub struct AppState {
    pub(crate) intake: Intake,
    pub(crate) webhooks: HashMap<String, WebhookSecret>,
    pub(crate) body_limit: usize,
    pub(crate) shutting_down: AtomicBool,
    pub(crate) counters: Counters,
    /// The tokens `/v1` admits (the admin's and the clients'); none turns it off.
    pub(crate) api_tokens: ApiTokens,
    /// The HTTP edge: its limits, open connections and sampled refusals.
    pub(crate) edge: Arc<Edge>,
    actions: HashMap<String, Vec<Arc<ActionConfig>>>,
    /// How long `/status` waits for its read model: well inside the request timeout, so that a
    /// late read model never turns a recorded update into a 503.
    status_freshness: Duration,
    /// The longest `GET /v1/operations/{id}?wait=` waits: a second under the request timeout,
    /// so that the answer beats the timeout's 503.
    pub(crate) longest_wait: Duration,
}

impl AppState {
    pub(crate) fn count(&self, recorded: &Recorded) {
        let counter = match recorded {
            Recorded::Accepted { .. } => &self.counters.accepted,
            Recorded::Duplicate { .. } => &self.counters.duplicates,
            Recorded::Collision { .. } => &self.counters.collisions,
            Recorded::Quarantined { .. } => &self.counters.quarantined,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The pure answer an update deserves, if any; a read-model failure only loses the answer.
    pub(crate) async fn answer(&self, bot: &str, recorded: &Recorded) -> Option<Answer> {
        let actions: Vec<&ActionConfig> = self
            .actions
            .get(bot)
            .map(|actions| actions.iter().map(AsRef::as_ref).collect())
            .unwrap_or_default();
        let store = self.intake.store();
        match replies::answer(store, bot, &actions, recorded, self.status_freshness).await {
            Ok(answer) => answer,
            Err(error) => {
                tracing::warn!(bot, %error, "could not read the answer to an update");
                None
            }
        }
    }
}

/// The Telegram update kinds opledger asks for: commands arrive in messages, button clicks in
/// callback queries.
pub fn allowed_updates() -> Vec<String> {
    vec!["message".to_owned(), "callback_query".to_owned()]
}

/// A built service, ready to run.
#[derive(Debug)]
pub struct App {
    state: Arc<AppState>,
    config: Config,
}

impl App {
    /// Builds the service on `store` with the system clock.
    pub fn build(config: &Config, store: AnyStore) -> Self {
        Self::build_with_clock(config, store, Arc::new(SystemClock))
    }

    /// Builds the service with a given clock (tests move time across retention windows).
    pub fn build_with_clock(config: &Config, store: AnyStore, clock: Arc<dyn Clock>) -> Self {
        let webhooks = config
            .bots
            .iter()
            .filter(|bot| bot.mode == BotMode::Webhook)
            .filter_map(|bot| {
                let secret = bot.webhook_secret.as_ref()?;
                Some((bot.name.clone(), WebhookSecret::new(secret)))
            })
            .collect();
        let mut actions: HashMap<String, Vec<Arc<ActionConfig>>> = HashMap::new();
        for action in &config.actions {
            actions
                .entry(action.bot.clone())
                .or_default()
                .push(Arc::new(action.clone()));
        }
        let state = AppState {
            intake: Intake::new(config, store, clock),
            webhooks,
            body_limit: config.server.body_limit_bytes,
            shutting_down: AtomicBool::new(false),
            counters: Counters::default(),
            api_tokens: ApiTokens::new(&config.api),
            edge: Arc::new(Edge::new(&config.server)),
            actions,
            status_freshness: replies::STATUS_FRESHNESS.min(config.server.request_timeout / 2),
            longest_wait: config
                .server
                .request_timeout
                .saturating_sub(Duration::from_secs(1))
                .min(Duration::from_secs(60)),
        };
        Self {
            state: Arc::new(state),
            config: config.clone(),
        }
    }

    /// The intake, for library users (issuing button tokens) and tests.
    pub fn intake(&self) -> &Intake {
        &self.state.intake
    }

    /// The counters the service keeps.
    pub fn counters(&self) -> &Counters {
        &self.state.counters
    }

    /// The HTTP routes with their layers: a request id on every request and response, a trace
    /// span that records the method, the route and the id (never headers or bodies), and a
    /// timeout answered with 503 so that Telegram retries.
    pub fn router(&self) -> Router {
        let timeout = self.config.server.request_timeout;
        Router::new()
            .route("/telegram/{bot}/webhook", post(webhook::receive))
            .route("/healthz", get(health::healthz))
            .route("/readyz", get(health::readyz))
            .route("/metrics", get(metrics::serve))
            .merge(api::router(self.state.clone()))
            .with_state(self.state.clone())
            .layer(TimeoutLayer::with_status_code(
                StatusCode::SERVICE_UNAVAILABLE,
                timeout,
            ))
            .layer(
                TraceLayer::new_for_http().make_span_with(|request: &Request<_>| {
                    let route = request
                        .extensions()
                        .get::<MatchedPath>()
                        .map_or("unmatched", MatchedPath::as_str);
                    let id = request
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-");
                    tracing::info_span!("request", method = %request.method(), route, id)
                }),
            )
            .layer(PropagateRequestIdLayer::x_request_id())
            .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
    }

    /// Starts long polling for the bots in poll mode, until `stop` holds `true`; each batch's
    /// offset is confirmed only once its updates are committed. [`App::run`] does this itself;
    /// a program that mounts [`App::router`] into its own server calls it, and awaits the
    /// handles after setting `stop`.
    pub fn spawn_pollers(&self, stop: watch::Receiver<bool>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut pollers = Vec::new();
        let redactor = self.config.redactor();
        for bot in self.config.bots.iter().filter(|b| b.mode == BotMode::Poll) {
            match poll::Poller::new(bot, &redactor, self.state.clone()) {
                Ok(poller) => pollers.push(tokio::spawn(poller.run(stop.clone()))),
                Err(error) => tracing::error!(bot = %bot.name, %error, "cannot poll this bot"),
            }
        }
        pollers
    }

    /// Serves on `listener` (through the edge's limits and timeouts, see `edge`) and polls the
    /// bots in poll mode until `shutdown` resolves; then stops accepting, closes idle
    /// connections, answers 503 to requests that still arrive, lets in-flight requests and
    /// polling batches finish (up to the configured grace), confirms the last polled batch and
    /// closes the store, so every acknowledged update is committed.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let grace = self.config.server.shutdown_grace;
        let (stop, stopped) = watch::channel(false);
        let pollers = self.spawn_pollers(stopped);
        let signalled = Arc::new(Notify::new());
        let state = self.state.clone();
        let on_signal = {
            let signalled = signalled.clone();
            async move {
                shutdown.await;
                tracing::info!("shutting down: no new requests, finishing in-flight work");
                state.shutting_down.store(true, Ordering::SeqCst);
                let _ = stop.send(true);
                signalled.notify_one();
            }
        };
        let edge = self.state.edge.clone();
        let server = edge::serve(edge.clone(), listener, self.router(), on_signal);
        let grace_expired = async {
            signalled.notified().await;
            tokio::time::sleep(grace).await;
        };
        // Refusals counted but not yet written get their line once their interval has passed.
        let sampled = tokio::spawn({
            let edge = edge.clone();
            async move {
                let mut tick = tokio::time::interval(refusals::INTERVAL / 4);
                loop {
                    tick.tick().await;
                    edge.refusals.flush(false);
                }
            }
        });
        tokio::select! {
            () = server => {}
            () = grace_expired => tracing::warn!(?grace, "in-flight requests outlived the grace period"),
        }
        sampled.abort();
        edge.refusals.flush(true);
        for poller in pollers {
            if tokio::time::timeout(grace.max(Duration::from_secs(1)), poller)
                .await
                .is_err()
            {
                tracing::warn!("a poller outlived the grace period");
            }
        }
        self.state.intake.store().close().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt;

    /// Requests that reach the handler once shutdown began are answered 503, whatever they are.
    #[tokio::test]
    async fn requests_during_shutdown_are_answered_503() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let store = AnyStore::open(&url, opledger_store::AnyOptions::default())
            .await
            .unwrap();
        let env = |name: &str| match name {
            "T" => Some("1:token".to_owned()),
            "S" => Some("secret".to_owned()),
            _ => None,
        };
        let config = Config::parse(
            "[[bots]]\nname = \"shop\"\ntoken_env = \"T\"\nwebhook_secret_env = \"S\"\n",
            &env,
        )
        .unwrap();
        let app = App::build(&config, store.clone());
        app.state.shutting_down.store(true, Ordering::SeqCst);
        let request = axum::http::Request::post("/telegram/shop/webhook")
            .header(crate::SECRET_HEADER, "secret")
            .body(Body::from(r#"{"update_id": 1}"#))
            .unwrap();
        let response = app.router().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            opledger_store::EventStore::head(&store)
                .await
                .unwrap()
                .position,
            0,
            "nothing was recorded"
        );
        store.close().await;
    }

    /// A readiness probe sees a service that is shutting down as not ready, while the process
    /// itself is still alive.
    #[tokio::test]
    async fn readyz_answers_503_while_shutting_down() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let store = AnyStore::open(&url, opledger_store::AnyOptions::default())
            .await
            .unwrap();
        let app = App::build(&Config::default(), store.clone());
        let get = |path: &str| axum::http::Request::get(path).body(Body::empty()).unwrap();
        let ready = app.router().oneshot(get("/readyz")).await.unwrap();
        assert_eq!(ready.status(), StatusCode::OK);
        app.state.shutting_down.store(true, Ordering::SeqCst);
        let response = app.router().oneshot(get("/readyz")).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"ready": false, "problems": ["the service is shutting down"]})
        );
        let alive = app.router().oneshot(get("/healthz")).await.unwrap();
        assert_eq!(alive.status(), StatusCode::OK);
        store.close().await;
    }
}
