//! The values that cross the event store's boundary: stream ids, expected versions, events to
//! append and events as recorded.

use std::fmt;
use std::ops::RangeInclusive;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::chain::{Hash, Link};
use crate::error::InvalidRequest;

/// A position in the global order of the ledger: 1 for the first event, gapless, commit-ordered.
pub type Position = u64;

/// A stream's version: the number of events in it. 0 means the stream does not exist yet; its
/// first event has version 1.
pub type StreamVersion = u64;

/// The longest stream id the store accepts, in bytes. Callers hash longer business keys.
pub const MAX_STREAM_ID_LEN: usize = 255;

/// The longest event type name the store accepts, in bytes.
pub const MAX_EVENT_TYPE_LEN: usize = 128;

/// The identity of one event stream, such as `op-coupon-spring:42`.
///
/// A stream id is printable text without control characters, at most [`MAX_STREAM_ID_LEN`] bytes.
/// The part before the first `-` is the stream's category (`op`, `update`, `cb`, ...), kept in the
/// `streams` table so that operators can list streams by kind.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(String);

impl StreamId {
    /// Checks and wraps a stream id.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidRequest> {
        let id = id.into();
        if id.is_empty() || id.len() > MAX_STREAM_ID_LEN {
            return Err(InvalidRequest::StreamIdLength { len: id.len() });
        }
        if id.chars().any(char::is_control) {
            return Err(InvalidRequest::StreamIdControlChar);
        }
        Ok(Self(id))
    }

    /// The stream id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The category: the part before the first `-`, or the whole id if it has none.
    pub fn category(&self) -> &str {
        self.0.split_once('-').map_or(self.0.as_str(), |(c, _)| c)
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl TryFrom<&str> for StreamId {
    type Error = InvalidRequest;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

/// What the caller believes about a stream's version when it appends: the optimistic
/// concurrency check that turns "check then insert" races into a clean loser.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpectedVersion {
    /// The stream must not exist yet (the same as `Exact(0)`).
    NoStream,
    /// The stream must be at exactly this version.
    Exact(StreamVersion),
    /// No check: append after whatever is there.
    Any,
}

impl ExpectedVersion {
    /// Whether a stream currently at `actual` satisfies this expectation.
    pub fn admits(self, actual: StreamVersion) -> bool {
        match self {
            ExpectedVersion::NoStream => actual == 0,
            ExpectedVersion::Exact(expected) => actual == expected,
            ExpectedVersion::Any => true,
        }
    }
}

impl fmt::Display for ExpectedVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpectedVersion::NoStream => f.write_str("no stream"),
            ExpectedVersion::Exact(v) => write!(f, "version {v}"),
            ExpectedVersion::Any => f.write_str("any version"),
        }
    }
}

/// An event to append. Payload and metadata are JSON kept as the exact bytes given: those bytes
/// are stored and hashed, never re-serialized.
#[derive(Clone, Debug)]
pub struct NewEvent {
    pub event_type: String,
    pub schema_version: u32,
    pub payload: Box<RawValue>,
    pub metadata: Box<RawValue>,
}

/// Compares payload and metadata by their exact text, the form that is stored and hashed.
impl PartialEq for NewEvent {
    fn eq(&self, other: &Self) -> bool {
        self.event_type == other.event_type
            && self.schema_version == other.schema_version
            && self.payload.get() == other.payload.get()
            && self.metadata.get() == other.metadata.get()
    }
}

impl Eq for NewEvent {}

impl NewEvent {
    /// An event with an empty metadata object.
    pub fn new(event_type: impl Into<String>, schema_version: u32, payload: Box<RawValue>) -> Self {
        Self {
            event_type: event_type.into(),
            schema_version,
            payload,
            metadata: empty_object(),
        }
    }

    /// Serializes `payload` (and `metadata`) with serde_json; the resulting bytes are what is stored.
    pub fn from_serialize<P: serde::Serialize, M: serde::Serialize>(
        event_type: impl Into<String>,
        schema_version: u32,
        payload: &P,
        metadata: &M,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self {
            event_type: event_type.into(),
            schema_version,
            payload: serde_json::value::to_raw_value(payload)?,
            metadata: serde_json::value::to_raw_value(metadata)?,
        })
    }

    /// Replaces the metadata.
    pub fn with_metadata(mut self, metadata: Box<RawValue>) -> Self {
        self.metadata = metadata;
        self
    }
}

/// `{}` as raw JSON.
pub fn empty_object() -> Box<RawValue> {
    RawValue::from_string("{}".to_owned()).expect("`{}` is valid JSON")
}

/// Events to append to one stream, with the version the caller expects that stream to be at,
/// and the stream's attachments to write or delete in the same transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRequest {
    pub stream: StreamId,
    pub expected: ExpectedVersion,
    pub events: Vec<NewEvent>,
    /// Attachments of the stream written (or replaced) if, and only if, the events are.
    pub attach: Vec<Attachment>,
    /// Names of the stream's attachments deleted if, and only if, the events are written.
    pub detach: Vec<String>,
}

impl AppendRequest {
    pub fn new(stream: StreamId, expected: ExpectedVersion, events: Vec<NewEvent>) -> Self {
        Self {
            stream,
            expected,
            events,
            attach: Vec::new(),
            detach: Vec::new(),
        }
    }
}

/// Bytes kept beside a stream's history, not in it: written with an append, read by name, and
/// deleted by a later append. Neither hashed nor exported; a store may lose them only with the
/// append that wrote them (docs/adr/0012).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// Its name within the stream (e.g. `raw:1`).
    pub name: String,
    pub body: Vec<u8>,
}

/// What one successful append call wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Appended {
    /// The global positions given to the call's events, in request order.
    pub positions: RangeInclusive<Position>,
    /// Each stream of the call with its version after the append, in request order.
    pub streams: Vec<(StreamId, StreamVersion)>,
    /// When the database recorded the events (one value per commit).
    pub recorded_at: DateTime<Utc>,
}

/// An event as the ledger holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedEvent {
    pub position: Position,
    pub stream_id: StreamId,
    pub version: StreamVersion,
    /// Deterministic: UUIDv5 of the stream id and version (see [`crate::event_id`]).
    pub event_id: Uuid,
    pub event_type: String,
    pub schema_version: u32,
    /// The exact JSON bytes that were appended and hashed.
    pub payload: Vec<u8>,
    pub metadata: Vec<u8>,
    /// From the database clock at commit time; never decreases along positions.
    pub recorded_at: DateTime<Utc>,
    pub prev_hash: Hash,
    pub hash: Hash,
}

impl RecordedEvent {
    /// The fields of this event that its hash seals.
    pub fn link(&self) -> Link<'_> {
        Link {
            position: self.position,
            stream_id: self.stream_id.as_str(),
            version: self.version,
            event_type: &self.event_type,
            schema_version: self.schema_version,
            payload: &self.payload,
            metadata: &self.metadata,
            recorded_at_micros: self.recorded_at.timestamp_micros(),
        }
    }
}

/// One stream as listed by [`crate::EventStore::list_streams`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    pub stream_id: StreamId,
    pub category: String,
    pub version: StreamVersion,
    pub created_at: DateTime<Utc>,
}

/// The end of the ledger: the last position and the hash that seals everything up to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub position: Position,
    pub hash: Hash,
}

/// The deterministic id of the event at `version` in `stream`: a backstop (unique index) against
/// any path that would write the same logical event twice.
pub fn event_id(stream: &StreamId, version: StreamVersion) -> Uuid {
    /// Namespace of opledger event ids (a fixed, random UUID).
    const EVENT_NAMESPACE: Uuid = Uuid::from_u128(0x6b1f_4f0e_9a2d_4c47_b7d1_31c0_5e2a_9f14);
    let mut name = Vec::with_capacity(stream.as_str().len() + 21);
    name.extend_from_slice(stream.as_str().as_bytes());
    name.push(0);
    name.extend_from_slice(version.to_string().as_bytes());
    Uuid::new_v5(&EVENT_NAMESPACE, &name)
}

/// Microseconds since the Unix epoch, the unit in which the store keeps and hashes time.
pub(crate) fn micros_to_datetime(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(micros).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ids_are_checked() {
        assert!(StreamId::new("").is_err());
        assert!(StreamId::new("a".repeat(MAX_STREAM_ID_LEN + 1)).is_err());
        assert!(StreamId::new("op-x\n").is_err());
        assert!(StreamId::new("a".repeat(MAX_STREAM_ID_LEN)).is_ok());
        assert_eq!(StreamId::new("op-coupon-a-b").unwrap().category(), "op");
        assert_eq!(StreamId::new("plain").unwrap().category(), "plain");
    }

    #[test]
    fn expected_version_admits() {
        assert!(ExpectedVersion::NoStream.admits(0));
        assert!(!ExpectedVersion::NoStream.admits(1));
        assert!(ExpectedVersion::Exact(0).admits(0));
        assert!(ExpectedVersion::Exact(3).admits(3));
        assert!(!ExpectedVersion::Exact(3).admits(4));
        assert!(ExpectedVersion::Any.admits(0));
        assert!(ExpectedVersion::Any.admits(9));
    }

    #[test]
    fn event_ids_are_deterministic_and_distinct() {
        let a = StreamId::new("op-a").unwrap();
        let b = StreamId::new("op-a1").unwrap();
        assert_eq!(event_id(&a, 1), event_id(&a, 1));
        assert_ne!(event_id(&a, 1), event_id(&a, 2));
        // "op-a" v11 and "op-a1" v1 must not collide: the separator makes names unambiguous.
        assert_ne!(event_id(&a, 11), event_id(&b, 1));
    }
}
