//! `GET /metrics`: what operators watch, in the OpenMetrics text format that Prometheus
//! scrapes, encoded by `prometheus-client`.
//!
//! Every scrape reads the ledger's head, the `metrics` read model and the projection registry
//! afresh, and adds this process's own counters. Names start with `opledger_` and end with
//! their unit (`_seconds`, `_events`, `_position`, `_total` for counters). Labels hold only
//! names opledger defines (states, outcomes, projection names): never a user's content, a bot
//! token or a secret.
//!
//! | metric | type | from |
//! |---|---|---|
//! | `opledger_operations{state}` | gauge | `metrics` read model |
//! | `opledger_oldest_pending_operation_age_seconds` | gauge | `metrics` (0 when none waits) |
//! | `opledger_oldest_claimed_operation_age_seconds` | gauge | `metrics` (0 when none is claimed) |
//! | `opledger_reconciliation_queue_operations` | gauge | `metrics` (operations waiting for a person) |
//! | `opledger_duplicate_deliveries_total` | counter | `metrics` (ledger, all processes) |
//! | `opledger_update_id_collisions_total` | counter | `metrics` |
//! | `opledger_key_conflicts_total` | counter | `metrics` |
//! | `opledger_quarantined_bodies_total` | counter | `metrics` |
//! | `opledger_transitions_rejected_total` | counter | `metrics` |
//! | `opledger_updates_forwarded_total` | counter | `metrics` (acknowledged by a gateway's bot) |
//! | `opledger_forward_failures_total` | counter | `metrics` (failed attempts) |
//! | `opledger_forwards_given_up_total` | counter | `metrics` |
//! | `opledger_forward_waiting_updates{bot}` | gauge | `forward_queue` (not yet acknowledged) |
//! | `opledger_forward_failing_updates{bot}` | gauge | `forward_queue` (of those, with a failed attempt) |
//! | `opledger_oldest_unforwarded_update_age_seconds{bot}` | gauge | `forward_queue`: the gateway's lag |
//! | `opledger_ledger_head_position` | gauge | the ledger's last position |
//! | `opledger_projection_checkpoint_position{projection,state}` | gauge | projection registry |
//! | `opledger_projection_lag_events{projection,state}` | gauge | head − checkpoint |
//! | `opledger_intake_updates_total{outcome}` | counter | this process, since it started |
//! | `opledger_webhook_rejected_secrets_total` | counter | this process |
//! | `opledger_api_rejected_tokens_total` | counter | this process |
//! | `opledger_http_connections` | gauge | this process |
//! | `opledger_http_refusals_total{reason}` | counter | this process |
//! | `opledger_append_wait_seconds` | histogram | this process: each append's wait for its batch |
//! | `opledger_append_write_seconds` | histogram | this process: its batch's write, to the commit |
//! | `opledger_append_batches_total` | counter | this process: batches committed (appends ÷ batches: a commit's share) |
//! | `opledger_storage_readable` | gauge | 1 if every read above succeeded, else 0 |
//!
//! When storage cannot be read the scrape still succeeds, with the process counters and
//! `opledger_storage_readable 0`, so that an alert can tell "storage down" from "process down".

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use opledger_projections::forward_queue::{self, QueueStats};
use opledger_projections::metrics::{self as read_model, MetricsSnapshot};
use opledger_projections::registry::{self, ProjectionStatus};
use opledger_store::EventStore;
use opledger_store::timings::{BUCKETS, Latencies};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::app::AppState;
use crate::refusals::Refusal;

/// The content type of the OpenMetrics text format, which Prometheus asks for and parses.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long a scrape waits for the database before it reports storage unreadable.
const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// Labels of one series: names opledger defines, never user content.
type Labels = Vec<(&'static str, String)>;

/// What the ledger says, read for one scrape.
struct Stored {
    head: u64,
    snapshot: MetricsSnapshot,
    projections: Vec<ProjectionStatus>,
    /// Each gateway's queue (bots with nothing waiting are absent).
    forwarding: Vec<QueueStats>,
    now: chrono::DateTime<chrono::Utc>,
}

/// `GET /metrics`.
pub(crate) async fn serve(State(state): State<Arc<AppState>>) -> Response {
    let stored = match tokio::time::timeout(READ_TIMEOUT, read(&state)).await {
        Ok(Ok(stored)) => Some(stored),
        Ok(Err(error)) => {
            tracing::warn!(%error, "metrics: storage unreadable; serving the process counters");
            None
        }
        Err(_) => {
            tracing::warn!("metrics: storage did not answer in time; serving the process counters");
            None
        }
    };
    let registry = registry(&state, stored.as_ref());
    let mut text = String::new();
    if let Err(error) = encode(&mut text, &registry) {
        tracing::error!(%error, "metrics could not be encoded");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response()
}

async fn read(state: &AppState) -> Result<Stored, Box<dyn std::error::Error + Send + Sync>> {
    let store = state.intake.store();
    let now = state.intake.clock().now();
    let head = store.head().await?.position;
    let snapshot = read_model::snapshot(store.reader(), now).await?;
    let projections = registry::list(store).await?;
    let forwarding = forward_queue::stats(store.reader()).await?;
    Ok(Stored {
        head,
        snapshot,
        projections,
        forwarding,
        now,
    })
}

/// A gauge holding `value`.
fn gauge(value: i64) -> Gauge {
    let gauge = Gauge::default();
    gauge.set(value);
    gauge
}

/// A floating-point gauge holding `value`.
fn gauge_f64(value: f64) -> Gauge<f64, AtomicU64> {
    let gauge = Gauge::<f64, AtomicU64>::default();
    gauge.set(value);
    gauge
}

/// A counter at `value`.
fn counter(value: u64) -> Counter {
    let counter = Counter::default();
    counter.inc_by(value);
    counter
}

/// A histogram of append timings, as the store counted them (`opledger_store::timings`).
#[derive(Debug)]
struct AppendHistogram(Latencies);

impl EncodeMetric for AppendHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let bounds = BUCKETS.iter().copied().chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds.zip(self.0.counts.iter().copied()).collect();
        encoder.encode_histogram::<NoLabelSet>(
            self.0.sum.as_secs_f64(),
            self.0.count(),
            &buckets,
            None,
        )
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// A non-negative count as a gauge value.
fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Every metric of one scrape.
fn registry(state: &AppState, stored: Option<&Stored>) -> Registry {
    let mut registry = Registry::with_prefix("opledger");
    if let Some(stored) = stored {
        register_stored(&mut registry, stored);
    }
    let counters = &state.counters;
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let intake = Family::<Labels, Counter>::default();
    for (outcome, value) in [
        ("accepted", &counters.accepted),
        ("duplicate", &counters.duplicates),
        ("collision", &counters.collisions),
        ("quarantined", &counters.quarantined),
    ] {
        intake
            .get_or_create(&vec![("outcome", outcome.to_owned())])
            .inc_by(load(value));
    }
    registry.register(
        "intake_updates",
        "Updates this process recorded since it started, by outcome: accepted (new), duplicate \
         (seen before), collision (same update id, other body), quarantined (not an update)",
        intake,
    );
    registry.register(
        "webhook_rejected_secrets",
        "Webhook requests this process refused for a missing or wrong secret since it started \
         (nothing is recorded in the ledger for them)",
        counter(load(&counters.rejected_secrets)),
    );
    registry.register(
        "api_rejected_tokens",
        "Read API requests this process refused for a missing or wrong admin token since it \
         started",
        counter(load(&counters.rejected_admin_tokens)),
    );
    registry.register(
        "http_connections",
        "HTTP connections open now (see [server] connection_limit)",
        gauge(signed(
            u64::try_from(state.edge.connections.count()).unwrap_or(u64::MAX),
        )),
    );
    let refused = Family::<Labels, Counter>::default();
    for kind in Refusal::ALL {
        refused
            .get_or_create(&vec![("reason", kind.code().to_owned())])
            .inc_by(state.edge.refusals.total(kind));
    }
    registry.register(
        "http_refusals",
        "What the HTTP edge refused since this process started, by reason: webhook_secret, \
         admin_token (401s), slow_head, slow_reader (timeouts), evicted (idle, to make room), \
         unvouched (a reserved slot not used for an authenticated request or health probe), \
         at_limit (every slot busy), accept_failed",
        refused,
    );
    let timings = state.intake.store().append_timings();
    registry.register_with_unit(
        "append_wait",
        "How long each append of this process (intake's, the worker's) waited for its \
         group-commit batch to begin: the batch ahead of it, the writer's upkeep between \
         batches (an SQLite checkpoint), a queue",
        Unit::Seconds,
        AppendHistogram(timings.wait()),
    );
    registry.register_with_unit(
        "append_write",
        "How long the batch of each append of this process took to write and commit (the \
         database's work and its sync to disk)",
        Unit::Seconds,
        AppendHistogram(timings.write()),
    );
    registry.register(
        "append_batches",
        "Group-commit batches this process wrote since it started, each one transaction: with \
         the appends (either histogram's count), how many appends a commit carried",
        counter(timings.batches()),
    );
    registry.register(
        "storage_readable",
        "1 if this scrape could read the ledger and its read models, 0 if not",
        gauge(i64::from(stored.is_some())),
    );
    registry
}

fn register_stored(registry: &mut Registry, stored: &Stored) {
    let snapshot = &stored.snapshot;
    let by_state = Family::<Labels, Gauge>::default();
    for (name, count) in &snapshot.by_state {
        by_state
            .get_or_create(&vec![("state", name.clone())])
            .set(signed(*count));
    }
    registry.register(
        "operations",
        "Operations in each state, from the ledger",
        by_state,
    );
    registry.register_with_unit(
        "oldest_pending_operation_age",
        "How long the oldest operation waiting to be claimed (received, or a retry scheduled) \
         has waited; 0 when none waits",
        Unit::Seconds,
        gauge_f64(snapshot.oldest_pending_age_secs.unwrap_or(0.0)),
    );
    registry.register_with_unit(
        "oldest_claimed_operation_age",
        "How long the oldest claimed operation (claimed, or its call sent) has been claimed; 0 \
         when none is",
        Unit::Seconds,
        gauge_f64(snapshot.oldest_claimed_age_secs.unwrap_or(0.0)),
    );
    let waiting = snapshot
        .by_state
        .iter()
        .find(|(name, _)| name == "needs_reconciliation")
        .map_or(0, |(_, count)| *count);
    registry.register(
        "reconciliation_queue_operations",
        "Operations waiting for a person to reconcile them (the reconciliation queue's length)",
        gauge(signed(waiting)),
    );
    for (name, help, value) in [
        (
            "duplicate_deliveries",
            "Deliveries of an update seen before, acknowledged without starting anything (ledger)",
            snapshot.duplicates_observed,
        ),
        (
            "update_id_collisions",
            "Update ids seen again with another body, not processed (ledger)",
            snapshot.update_id_collisions,
        ),
        (
            "key_conflicts",
            "Requests refused for reusing a business key with other parameters (ledger)",
            snapshot.key_conflicts,
        ),
        (
            "quarantined_bodies",
            "Authenticated webhook bodies that were not updates, kept as digests (ledger)",
            snapshot.quarantined,
        ),
        (
            "transitions_rejected",
            "Stale or late commands the domain refused and recorded (ledger)",
            snapshot.transitions_rejected,
        ),
        (
            "updates_forwarded",
            "Updates a gateway forwarded and its bot acknowledged with 2xx (ledger)",
            snapshot.updates_forwarded,
        ),
        (
            "forward_failures",
            "Attempts to forward an update to a bot's webhook that failed (ledger)",
            snapshot.forward_failures,
        ),
        (
            "forwards_given_up",
            "Updates a gateway gave up forwarding after the configured age (ledger)",
            snapshot.forwards_given_up,
        ),
    ] {
        registry.register(name, help, counter(value));
    }
    register_forwarding(registry, &stored.forwarding, stored.now);
    registry.register(
        "ledger_head_position",
        "The ledger's last position (events appended, all processes)",
        gauge(signed(stored.head)),
    );
    let checkpoints = Family::<Labels, Gauge>::default();
    let lags = Family::<Labels, Gauge>::default();
    for projection in &stored.projections {
        let labels = vec![
            ("projection", projection.name.clone()),
            ("state", projection.state.clone()),
        ];
        checkpoints
            .get_or_create(&labels)
            .set(signed(projection.checkpoint));
        lags.get_or_create(&labels).set(signed(projection.lag));
    }
    registry.register(
        "projection_checkpoint_position",
        "The last ledger position each projection version has applied",
        checkpoints,
    );
    registry.register(
        "projection_lag_events",
        "Events appended that each projection version has not applied yet (head - checkpoint)",
        lags,
    );
}

/// Each gateway's queue, labelled by the bot's configured name.
fn register_forwarding(
    registry: &mut Registry,
    queues: &[QueueStats],
    now: chrono::DateTime<chrono::Utc>,
) {
    let waiting = Family::<Labels, Gauge>::default();
    let failing = Family::<Labels, Gauge>::default();
    let oldest = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    for queue in queues {
        let labels = vec![("bot", queue.bot.clone())];
        waiting.get_or_create(&labels).set(signed(queue.waiting));
        failing.get_or_create(&labels).set(signed(queue.failing));
        let age = queue
            .oldest_received_at
            .map_or(0.0, |at| (now - at).as_seconds_f64().max(0.0));
        oldest.get_or_create(&labels).set(age);
    }
    registry.register(
        "forward_waiting_updates",
        "Updates a gateway has not yet had acknowledged by its bot, per bot",
        waiting,
    );
    registry.register(
        "forward_failing_updates",
        "Of the waiting updates, those with at least one failed attempt, per bot",
        failing,
    );
    registry.register_with_unit(
        "oldest_unforwarded_update_age",
        "How long the oldest update a gateway still owes its bot has waited, per bot (absent \
         when none waits)",
        Unit::Seconds,
        oldest,
    );
}
