//! Checking a ledger's integrity from its events alone: gapless positions, an unbroken hash
//! chain, contiguous stream versions and deterministic event ids.
//!
//! Feed every event in position order to a [`Verifier`]; it keeps only the chain's end and each
//! stream's last version, so memory grows with the number of streams, not of events.

use std::collections::HashMap;

use crate::chain::Hash;
use crate::model::{Head, Position, RecordedEvent, StreamVersion, event_id};

/// The first thing found wrong, with the position where it shows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Broken {
    #[error("position {found} follows position {}: events are missing or reordered", expected - 1)]
    PositionGap { expected: Position, found: Position },
    #[error("event {position} does not link to its predecessor (prev_hash differs)")]
    BrokenLink { position: Position },
    #[error("event {position} was altered: its stored hash does not match its content")]
    HashMismatch { position: Position },
    #[error(
        "event {position} is version {found} of stream `{stream}`, expected version {expected}"
    )]
    VersionGap {
        position: Position,
        stream: String,
        expected: StreamVersion,
        found: StreamVersion,
    },
    #[error("event {position} has an event id that does not derive from its stream and version")]
    EventId { position: Position },
    #[error("the ledger head says position {head_position}, but the events end at {last}")]
    HeadPosition {
        head_position: Position,
        last: Position,
    },
    #[error("the ledger head's hash does not match the last event's hash")]
    HeadHash,
}

/// Verifies events fed in position order.
#[derive(Debug)]
pub struct Verifier {
    next: Position,
    prev: Hash,
    versions: HashMap<String, StreamVersion>,
}

impl Default for Verifier {
    fn default() -> Self {
        Self::new()
    }
}

impl Verifier {
    /// A verifier expecting the ledger's first event.
    pub fn new() -> Self {
        Self {
            next: 1,
            prev: Hash::GENESIS,
            versions: HashMap::new(),
        }
    }

    /// Checks the next event.
    pub fn check(&mut self, event: &RecordedEvent) -> Result<(), Broken> {
        let position = event.position;
        if position != self.next {
            return Err(Broken::PositionGap {
                expected: self.next,
                found: position,
            });
        }
        if event.prev_hash != self.prev {
            return Err(Broken::BrokenLink { position });
        }
        if event.link().seal(&self.prev) != event.hash {
            return Err(Broken::HashMismatch { position });
        }
        let last = self
            .versions
            .entry(event.stream_id.as_str().to_owned())
            .or_insert(0);
        if event.version != *last + 1 {
            return Err(Broken::VersionGap {
                position,
                stream: event.stream_id.to_string(),
                expected: *last + 1,
                found: event.version,
            });
        }
        *last = event.version;
        if event.event_id != event_id(&event.stream_id, event.version) {
            return Err(Broken::EventId { position });
        }
        self.prev = event.hash;
        self.next += 1;
        Ok(())
    }

    /// Checks that the events seen end where the ledger head says, and returns how many there
    /// were.
    pub fn finish(self, head: &Head) -> Result<Position, Broken> {
        let last = self.next - 1;
        if head.position != last {
            return Err(Broken::HeadPosition {
                head_position: head.position,
                last,
            });
        }
        if head.hash != self.prev {
            return Err(Broken::HeadHash);
        }
        Ok(last)
    }

    /// Each stream's version as counted from its events.
    pub fn stream_versions(&self) -> &HashMap<String, StreamVersion> {
        &self.versions
    }
}
