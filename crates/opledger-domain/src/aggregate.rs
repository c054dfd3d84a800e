//! The shape every aggregate shares, so that stores, workers and tests can drive any of them.

use chrono::{DateTime, Utc};

use crate::event::DomainEvent;

/// A consistency boundary living in one event stream.
///
/// It exists so that code that loads a stream, decides and appends at the expected version can
/// be written once. Each implementation forwards to its module's free `decide` and `evolve`
/// functions, which are the primary API.
pub trait Aggregate: Default + Clone + std::fmt::Debug {
    /// The prefix of this aggregate's stream ids (`{category}-…`, see [`crate::ids`]), which the
    /// store records as the stream's category.
    const STREAM_CATEGORY: &'static str;

    /// The events this aggregate's stream holds.
    type Event: DomainEvent + Clone + std::fmt::Debug + PartialEq;
    /// The commands it decides on.
    type Command: std::fmt::Debug;
    /// Why a command was refused.
    type Rejection: std::error::Error + Clone + PartialEq;

    /// Decides which events a command produces, without changing the state.
    fn decide(
        &self,
        command: &Self::Command,
        now: DateTime<Utc>,
    ) -> Result<Vec<Self::Event>, Self::Rejection>;

    /// Applies one event.
    fn evolve(self, event: &Self::Event) -> Self;

    /// The number of events applied so far: the expected version for the next append.
    fn version(&self) -> u64;

    /// Rebuilds the state from a stream's events.
    fn replay<'a>(events: impl IntoIterator<Item = &'a Self::Event>) -> Self
    where
        Self::Event: 'a,
    {
        events.into_iter().fold(Self::default(), Self::evolve)
    }
}
