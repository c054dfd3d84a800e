//! Events as the read API shows them, and `/v1/streams/{stream_id}/events`: any stream's events
//! in version order, a page at a time.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use chrono::{DateTime, Utc};
use opledger_store::{EventStore, RecordedEvent, StreamId};
use serde::Serialize;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use crate::api::ReadErrors;
use crate::api::auth::Admin;
use crate::api::error::ApiError;
use crate::api::params::{Params, VERSION_MAX, quote};
use crate::app::AppState;

/// The query parameters of the event routes.
pub(crate) const PARAMS: &[&str] = &["from_version", "limit"];
/// The most events one answer holds, and how many when `limit` is not given.
const MAX_LIMIT: u32 = 1000;

/// One event as the ledger holds it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventView {
    /// Its place in the ledger's global order (gapless, from 1).
    pub(crate) position: u64,
    pub(crate) stream_id: String,
    /// Its place in its stream (from 1).
    pub(crate) version: u64,
    /// Deterministic: UUIDv5 of the stream id and version.
    pub(crate) event_id: String,
    #[schema(example = "Confirmed")]
    pub(crate) event_type: String,
    pub(crate) schema_version: u32,
    /// The payload, exactly as appended and hashed (see docs/events.md).
    #[schema(value_type = Object)]
    pub(crate) payload: Box<RawValue>,
    /// Who or what caused it: `{"causation": …, "correlation": …}`.
    #[schema(value_type = Object)]
    pub(crate) metadata: Box<RawValue>,
    /// The database clock at commit time.
    pub(crate) recorded_at: DateTime<Utc>,
    /// The previous event's hash (hex SHA-256); the chain's genesis for position 1.
    pub(crate) prev_hash: String,
    /// This event's hash (hex SHA-256), sealing it onto the chain.
    pub(crate) hash: String,
}

impl TryFrom<RecordedEvent> for EventView {
    type Error = ApiError;

    fn try_from(event: RecordedEvent) -> Result<Self, ApiError> {
        let json = |bytes: Vec<u8>, what: &str| {
            String::from_utf8(bytes)
                .ok()
                .and_then(|text| RawValue::from_string(text).ok())
                .ok_or_else(|| {
                    ApiError::Internal(format!(
                        "the {what} of event {} is not JSON; run `opledger audit verify`",
                        event.position
                    ))
                })
        };
        Ok(EventView {
            payload: json(event.payload, "payload")?,
            metadata: json(event.metadata, "metadata")?,
            position: event.position,
            stream_id: event.stream_id.as_str().to_owned(),
            version: event.version,
            event_id: event.event_id.to_string(),
            event_type: event.event_type,
            schema_version: event.schema_version,
            recorded_at: event.recorded_at,
            prev_hash: event.prev_hash.to_hex(),
            hash: event.hash.to_hex(),
        })
    }
}

/// A page of one stream's events.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventPage {
    pub(crate) stream_id: String,
    /// The stream's version when it was read (its number of events).
    pub(crate) stream_version: u64,
    /// In version order.
    pub(crate) events: Vec<EventView>,
    /// Where the next page starts (`from_version`), if the stream has more events.
    pub(crate) next_from_version: Option<u64>,
}

/// Reads a page of `stream` as `params` (`from_version`, `limit`) ask; 404 if the stream does
/// not exist.
pub(crate) async fn page(
    state: &AppState,
    stream: &StreamId,
    params: &Params,
) -> Result<EventPage, ApiError> {
    let what = format!("an integer from 1 to {VERSION_MAX} (streams start at version 1)");
    let from_version = params.parsed::<u64>("from_version", &what)?.unwrap_or(1);
    if !(1..=VERSION_MAX).contains(&from_version) {
        return Err(ApiError::bad(
            "from_version",
            format!("must be {what}, not `{from_version}`"),
        ));
    }
    let limit = params.limit(MAX_LIMIT, MAX_LIMIT)?;
    let store = state.intake.store();
    let stream_version = store.stream_version(stream).await?;
    if stream_version == 0 {
        return Err(ApiError::NotFound(format!(
            "no stream is named `{}`",
            stream.as_str()
        )));
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let events = store.read_stream(stream, from_version, limit).await?;
    let last = events
        .last()
        .map_or(from_version.saturating_sub(1), |e| e.version);
    let next_from_version = (last < stream_version && events.len() == limit).then_some(last + 1);
    Ok(EventPage {
        stream_id: stream.as_str().to_owned(),
        stream_version,
        events: events
            .into_iter()
            .map(EventView::try_from)
            .collect::<Result<_, _>>()?,
        next_from_version,
    })
}

/// A stream's events, in version order.
#[utoipa::path(
    get,
    path = "/v1/streams/{stream_id}/events",
    operation_id = "stream_events",
    tag = "streams",
    params(
        ("stream_id" = String, Path, min_length = 1, max_length = 255, pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$", description = "The stream's id, e.g. `op-coupon-spring:42`, \
            `update-shop-17`, `cb-…` (percent-encode characters outside the URL path set)."),
        ("from_version" = Option<i64>, Query, minimum = 1, maximum = 9_223_372_036_854_775_807_i64, description = "The first stream version to \
            return, from 1 (the default)."),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 4_294_967_295_u32, description = "At most this many events, 1 to 1000 \
            (larger values, up to 4294967295, are capped); default 1000."),
    ),
    responses(
        (status = 200, description = "A page of the stream's events.", body = EventPage),
        ReadErrors,
    ),
    security(("admin_token" = [])),
)]
pub(crate) async fn stream(
    _: Admin,
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<EventPage>, ApiError> {
    let params = Params::parse(query.as_deref(), PARAMS)?;
    let Path(id) = path.map_err(|e| ApiError::bad("stream_id", e.body_text()))?;
    let stream = StreamId::new(id.clone()).map_err(|e| {
        ApiError::bad(
            "stream_id",
            format!("{} is not a stream id: {e}", quote(&id)),
        )
    })?;
    Ok(Json(page(&state, &stream, &params).await?))
}
