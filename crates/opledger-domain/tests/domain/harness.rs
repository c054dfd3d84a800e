//! A small given/when/then harness that drives any aggregate without a store.

use chrono::{DateTime, Utc};
use opledger_domain::Aggregate;

/// The history an aggregate is rebuilt from before the command.
pub(crate) struct Given<A: Aggregate> {
    state: A,
}

/// Rebuilds an aggregate from `events`.
pub(crate) fn given<A: Aggregate>(events: impl IntoIterator<Item = A::Event>) -> Given<A> {
    let events: Vec<A::Event> = events.into_iter().collect();
    Given {
        state: A::replay(&events),
    }
}

impl<A: Aggregate> Given<A> {
    /// Decides `command` at `now`.
    pub(crate) fn when(self, command: A::Command, now: DateTime<Utc>) -> When<A> {
        let result = self.state.decide(&command, now);
        When {
            state: self.state,
            command,
            result,
        }
    }
}

/// A decision, waiting to be checked.
pub(crate) struct When<A: Aggregate> {
    state: A,
    command: A::Command,
    result: Result<Vec<A::Event>, A::Rejection>,
}

impl<A: Aggregate> When<A> {
    /// Asserts the command was accepted with exactly `expected`; returns the state after them.
    pub(crate) fn then(self, expected: Vec<A::Event>) -> A {
        match self.result {
            Ok(events) => {
                assert_eq!(events, expected, "events of {:?}", self.command);
                let version = self.state.version();
                let after = events.iter().fold(self.state, A::evolve);
                assert_eq!(after.version(), version + events.len() as u64);
                after
            }
            Err(rejection) => panic!(
                "{:?} was rejected ({rejection}), expected {expected:?}",
                self.command
            ),
        }
    }

    /// Asserts the command was refused with exactly `expected`.
    pub(crate) fn then_reject(self, expected: A::Rejection) {
        match self.result {
            Ok(events) => panic!(
                "{:?} was accepted with {events:?}, expected {expected:?}",
                self.command
            ),
            Err(rejection) => assert_eq!(rejection, expected, "rejection of {:?}", self.command),
        }
    }

    /// The raw result, for checks the two above do not cover.
    pub(crate) fn result(self) -> (A, Result<Vec<A::Event>, A::Rejection>) {
        (self.state, self.result)
    }
}
