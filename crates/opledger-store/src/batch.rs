//! The backend-independent heart of an append: validating calls, deciding each call of a batch
//! against the streams' versions, and sealing the accepted events into positioned, hash-chained
//! rows. Backends only do the I/O around these pure steps, so both behave the same by
//! construction.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use crate::chain::{Hash, Link};
use crate::error::{InvalidRequest, StoreError};
use crate::model::{
    AppendRequest, Appended, Head, MAX_EVENT_TYPE_LEN, NewEvent, Position, StreamId, StreamVersion,
    event_id,
};

/// Checks one append call before it is queued, so a malformed call never reaches a batch.
pub(crate) fn validate(
    requests: &[AppendRequest],
    max_events: usize,
) -> Result<(), InvalidRequest> {
    if requests.is_empty() {
        return Err(InvalidRequest::NoRequests);
    }
    let mut seen = HashSet::with_capacity(requests.len());
    let mut events = 0;
    for request in requests {
        if request.events.is_empty() {
            return Err(InvalidRequest::NoEvents {
                stream: request.stream.clone(),
            });
        }
        if !seen.insert(&request.stream) {
            return Err(InvalidRequest::DuplicateStream {
                stream: request.stream.clone(),
            });
        }
        for event in &request.events {
            if event.schema_version == 0 || i32::try_from(event.schema_version).is_err() {
                return Err(InvalidRequest::SchemaVersion {
                    schema_version: event.schema_version,
                });
            }
            let t = &event.event_type;
            if t.is_empty() || t.len() > MAX_EVENT_TYPE_LEN || t.chars().any(char::is_control) {
                return Err(InvalidRequest::EventType {
                    event_type: t.clone(),
                });
            }
        }
        events += request.events.len();
    }
    if events > max_events {
        return Err(InvalidRequest::TooManyEvents {
            events,
            limit: max_events,
        });
    }
    Ok(())
}

/// Every distinct stream a batch touches, sorted (the order in which backends lock them).
pub(crate) fn streams_of(calls: &[Vec<AppendRequest>]) -> Vec<&StreamId> {
    let mut streams: Vec<&StreamId> = calls
        .iter()
        .flatten()
        .map(|request| &request.stream)
        .collect();
    streams.sort_unstable();
    streams.dedup();
    streams
}

/// A stream's version after the batch, for the backend to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamWrite<'a> {
    pub(crate) stream: &'a StreamId,
    /// The version the stream had when the batch started (0: the stream is new).
    pub(crate) before: StreamVersion,
    pub(crate) after: StreamVersion,
}

/// One event accepted into the batch, with its stream version but no position yet.
#[derive(Debug)]
struct Accepted<'a> {
    stream: &'a StreamId,
    version: StreamVersion,
    event: &'a NewEvent,
}

/// An accepted call: where its events sit in the batch and its streams' new versions.
#[derive(Debug)]
struct AcceptedCall {
    events: std::ops::Range<usize>,
    streams: Vec<(StreamId, StreamVersion)>,
}

/// The outcome of deciding every call of a batch against the current stream versions.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    /// Per call: what was accepted, or the conflict that rejected it.
    calls: Vec<Result<AcceptedCall, StoreError>>,
    accepted: Vec<Accepted<'a>>,
    pub(crate) streams: Vec<StreamWrite<'a>>,
}

impl<'a> Plan<'a> {
    /// Decides each call in order. A call is accepted when every one of its requests matches the
    /// stream's version as left by the calls accepted before it; otherwise it is rejected whole
    /// with the first mismatch, and later calls do not see it.
    pub(crate) fn decide(
        calls: &'a [Vec<AppendRequest>],
        current: &HashMap<StreamId, StreamVersion>,
    ) -> Self {
        let mut versions: HashMap<&'a StreamId, (StreamVersion, StreamVersion)> = HashMap::new();
        let mut outcomes = Vec::with_capacity(calls.len());
        let mut accepted = Vec::new();
        for call in calls {
            let conflict = call.iter().find_map(|request| {
                let actual = versions
                    .get(&request.stream)
                    .map(|&(_, now)| now)
                    .or_else(|| current.get(&request.stream).copied())
                    .unwrap_or(0);
                (!request.expected.admits(actual)).then(|| StoreError::VersionConflict {
                    stream: request.stream.clone(),
                    expected: request.expected,
                    actual,
                })
            });
            if let Some(conflict) = conflict {
                outcomes.push(Err(conflict));
                continue;
            }
            let start = accepted.len();
            let mut after = Vec::with_capacity(call.len());
            for request in call {
                let before = current.get(&request.stream).copied().unwrap_or(0);
                let entry = versions.entry(&request.stream).or_insert((before, before));
                for event in &request.events {
                    entry.1 += 1;
                    accepted.push(Accepted {
                        stream: &request.stream,
                        version: entry.1,
                        event,
                    });
                }
                after.push((request.stream.clone(), entry.1));
            }
            outcomes.push(Ok(AcceptedCall {
                events: start..accepted.len(),
                streams: after,
            }));
        }
        let mut streams: Vec<StreamWrite<'a>> = versions
            .into_iter()
            .map(|(stream, (before, after))| StreamWrite {
                stream,
                before,
                after,
            })
            .collect();
        streams.sort_unstable_by(|a, b| a.stream.cmp(b.stream));
        Plan {
            calls: outcomes,
            accepted,
            streams,
        }
    }

    /// How many events the batch will write.
    pub(crate) fn event_count(&self) -> usize {
        self.accepted.len()
    }

    /// Gives the accepted events their positions after `head`, their ids and their hashes.
    pub(crate) fn seal(self, head: Head, recorded_at_micros: i64) -> Sealed<'a> {
        let mut prev = head.hash;
        let rows: Vec<EventRow<'a>> = self
            .accepted
            .iter()
            .zip(head.position + 1..)
            .map(|(a, position)| {
                let link = Link {
                    position,
                    stream_id: a.stream.as_str(),
                    version: a.version,
                    event_type: &a.event.event_type,
                    schema_version: a.event.schema_version,
                    payload: a.event.payload.get().as_bytes(),
                    metadata: a.event.metadata.get().as_bytes(),
                    recorded_at_micros,
                };
                let hash = link.seal(&prev);
                let row = EventRow {
                    link,
                    event_id: event_id(a.stream, a.version),
                    prev_hash: prev,
                    hash,
                };
                prev = hash;
                row
            })
            .collect();
        let recorded_at = crate::model::micros_to_datetime(recorded_at_micros);
        let results = self
            .calls
            .into_iter()
            .map(|outcome| {
                outcome.map(|call| Appended {
                    positions: head.position + 1 + call.events.start as Position
                        ..=head.position + call.events.end as Position,
                    streams: call.streams,
                    recorded_at,
                })
            })
            .collect();
        Sealed {
            new_head: Head {
                position: head.position + rows.len() as Position,
                hash: prev,
            },
            rows,
            streams: self.streams,
            results,
        }
    }

    /// The per-call results when nothing was accepted (every call conflicted).
    pub(crate) fn into_rejections(self) -> Vec<Result<Appended, StoreError>> {
        self.calls
            .into_iter()
            .map(|outcome| match outcome {
                Err(conflict) => Err(conflict),
                Ok(_) => unreachable!("a plan without events has no accepted call"),
            })
            .collect()
    }
}

/// One event row as the backends insert it.
#[derive(Debug)]
pub(crate) struct EventRow<'a> {
    pub(crate) link: Link<'a>,
    pub(crate) event_id: Uuid,
    pub(crate) prev_hash: Hash,
    pub(crate) hash: Hash,
}

/// A batch ready to write: rows, stream versions, the new head, and each call's answer.
#[derive(Debug)]
pub(crate) struct Sealed<'a> {
    pub(crate) rows: Vec<EventRow<'a>>,
    pub(crate) streams: Vec<StreamWrite<'a>>,
    pub(crate) new_head: Head,
    pub(crate) results: Vec<Result<Appended, StoreError>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ExpectedVersion, NewEvent};

    fn event() -> NewEvent {
        NewEvent::new(
            "Test",
            1,
            serde_json::value::RawValue::from_string("{}".into()).unwrap(),
        )
    }

    fn req(stream: &str, expected: ExpectedVersion, n: usize) -> AppendRequest {
        AppendRequest::new(
            StreamId::new(stream).unwrap(),
            expected,
            (0..n).map(|_| event()).collect(),
        )
    }

    #[test]
    fn validation_names_the_problem() {
        assert_eq!(validate(&[], 10), Err(InvalidRequest::NoRequests));
        assert!(matches!(
            validate(&[req("a", ExpectedVersion::Any, 0)], 10),
            Err(InvalidRequest::NoEvents { .. })
        ));
        assert!(matches!(
            validate(
                &[
                    req("a", ExpectedVersion::Any, 1),
                    req("a", ExpectedVersion::Any, 1)
                ],
                10
            ),
            Err(InvalidRequest::DuplicateStream { .. })
        ));
        assert!(matches!(
            validate(&[req("a", ExpectedVersion::Any, 11)], 10),
            Err(InvalidRequest::TooManyEvents {
                events: 11,
                limit: 10
            })
        ));
        let mut bad = req("a", ExpectedVersion::Any, 1);
        bad.events[0].event_type = String::new();
        assert!(matches!(
            validate(&[bad], 10),
            Err(InvalidRequest::EventType { .. })
        ));
    }

    #[test]
    fn calls_in_one_batch_see_each_other_and_losers_write_nothing() {
        let calls = vec![
            vec![req("s", ExpectedVersion::NoStream, 2)],
            vec![req("s", ExpectedVersion::NoStream, 1)], // loses to the first call
            vec![
                req("s", ExpectedVersion::Exact(2), 1),
                req("t", ExpectedVersion::Any, 1),
            ],
            vec![
                req("u", ExpectedVersion::Any, 1),
                req("s", ExpectedVersion::Exact(2), 1),
            ], // stale
        ];
        let current = HashMap::from([(StreamId::new("t").unwrap(), 5)]);
        let plan = Plan::decide(&calls, &current);
        assert_eq!(plan.event_count(), 4);
        let sealed = plan.seal(
            Head {
                position: 10,
                hash: Hash::GENESIS,
            },
            1,
        );
        let positions: Vec<_> = sealed.rows.iter().map(|r| r.link.position).collect();
        assert_eq!(positions, vec![11, 12, 13, 14]);
        assert_eq!(sealed.new_head.position, 14);
        assert_eq!(sealed.results[0].as_ref().unwrap().positions, 11..=12);
        assert!(matches!(
            &sealed.results[1],
            Err(StoreError::VersionConflict { actual: 2, .. })
        ));
        let third = sealed.results[2].as_ref().unwrap();
        assert_eq!(third.positions, 13..=14);
        assert_eq!(
            third.streams,
            vec![
                (StreamId::new("s").unwrap(), 3),
                (StreamId::new("t").unwrap(), 6)
            ]
        );
        // The fourth call conflicts on its second stream, so its first stream ("u") is untouched.
        assert!(matches!(
            &sealed.results[3],
            Err(StoreError::VersionConflict {
                actual: 3,
                expected: ExpectedVersion::Exact(2),
                ..
            })
        ));
        let streams: Vec<_> = sealed
            .streams
            .iter()
            .map(|w| (w.stream.as_str(), w.before, w.after))
            .collect();
        assert_eq!(streams, vec![("s", 0, 3), ("t", 5, 6)]);
        // The chain links each row to the previous one.
        for pair in sealed.rows.windows(2) {
            assert_eq!(pair[1].prev_hash, pair[0].hash);
        }
        assert_eq!(sealed.new_head.hash, sealed.rows[3].hash);
    }
}
