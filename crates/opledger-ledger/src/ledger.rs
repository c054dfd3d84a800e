//! The bridge between the pure domain and the store: loading an aggregate from its stream and
//! turning decided events into appendable ones.

use opledger_domain::{Aggregate, DecodeError, DomainEvent, EventMetadata};
use opledger_store::{
    AnyStore, AppendRequest, EventStore, ExpectedVersion, NewEvent, StoreError, StreamId,
    StreamVersion,
};
use serde_json::value::RawValue;

/// Why the ledger could not be read or written as the domain expects.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stream `{stream}` holds an event this binary cannot read: {source}")]
    Decode {
        stream: String,
        #[source]
        source: DecodeError,
    },
    #[error("event could not be encoded: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Replays a stream into its aggregate; an absent stream is the aggregate's initial state.
pub async fn load<A: Aggregate>(store: &AnyStore, stream: &StreamId) -> Result<A, LedgerError> {
    let recorded = store.read_stream(stream, 1, usize::MAX).await?;
    let events = recorded
        .iter()
        .map(|e| A::Event::from_stored(&e.event_type, e.schema_version, &e.payload))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| LedgerError::Decode {
            stream: stream.to_string(),
            source,
        })?;
    Ok(A::replay(&events))
}

/// The expected version for an append decided on a state at `version`.
pub fn expected(version: StreamVersion) -> ExpectedVersion {
    if version == 0 {
        ExpectedVersion::NoStream
    } else {
        ExpectedVersion::Exact(version)
    }
}

/// Decided events as an append request at `expected`.
pub fn request<E: DomainEvent>(
    stream: StreamId,
    expected: ExpectedVersion,
    events: &[E],
    metadata: &EventMetadata,
) -> Result<AppendRequest, LedgerError> {
    Ok(encode(stream, expected, events, metadata)?)
}

/// Decided events encoded into an append request; fails only if serde_json cannot encode one.
pub(crate) fn encode<E: DomainEvent>(
    stream: StreamId,
    expected: ExpectedVersion,
    events: &[E],
    metadata: &EventMetadata,
) -> Result<AppendRequest, serde_json::Error> {
    let metadata = raw(metadata.to_bytes()?)?;
    let events = events
        .iter()
        .map(|event| {
            Ok(NewEvent {
                event_type: event.event_type().to_owned(),
                schema_version: event.schema_version(),
                payload: raw(event.to_payload()?)?,
                metadata: metadata.clone(),
            })
        })
        .collect::<Result<Vec<_>, serde_json::Error>>()?;
    Ok(AppendRequest::new(stream, expected, events))
}

fn raw(bytes: Vec<u8>) -> Result<Box<RawValue>, serde_json::Error> {
    let text = String::from_utf8(bytes).expect("serde_json writes UTF-8");
    RawValue::from_string(text)
}
