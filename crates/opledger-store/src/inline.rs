//! Inline read models: tables kept in the same transaction as the appends that change them, so a
//! reader that just appended sees its own write (read-your-writes), and a batch whose read model
//! cannot be updated is not committed either.
//!
//! A projection's SQL lives with the projection (`opledger-projections`, `projections/`); the
//! store only calls it at the right moments: once at open (`install`) and inside every append
//! transaction with the batch's events in position order (`apply`).

use std::error::Error as StdError;
use std::fmt::Debug;
use std::sync::Arc;

use crate::backend::Conn;
use crate::chain::Link;
use futures_util::future::BoxFuture;

/// What a projection may fail with; a `sqlx::Error` inside is classified like the store's own.
pub type ProjectionError = Box<dyn StdError + Send + Sync + 'static>;

/// A read model updated inside the append transaction.
///
/// `apply` gets the batch's accepted events, each with its final position, stream version and
/// `recorded_at` ([`Link`]); it must be deterministic and touch only its own tables, because the
/// same code rebuilds the model from the log.
pub trait InlineProjection: Send + Sync + Debug + 'static {
    /// A stable name, for errors and logs.
    fn name(&self) -> &'static str;

    /// Creates the projection's tables if missing; runs once when a store opens.
    fn install<'a>(&'a self, connection: Conn<'a>) -> BoxFuture<'a, Result<(), ProjectionError>>;

    /// Applies a batch's events inside its transaction.
    fn apply<'a>(
        &'a self,
        connection: Conn<'a>,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>>;
}

/// The inline projections a store keeps, in the order they are applied.
pub type InlineProjections = Vec<Arc<dyn InlineProjection>>;

/// Why a projection failed, with its name.
#[derive(Debug, thiserror::Error)]
#[error("inline projection `{name}` failed: {source}")]
pub struct InlineFailed {
    pub name: &'static str,
    #[source]
    pub source: ProjectionError,
}

/// Maps a projection failure to a store error: a database error the backend deems retryable
/// (busy, connection lost) stays retryable, anything else is a bug.
pub(crate) fn failed(
    name: &'static str,
    error: ProjectionError,
    retryable: fn(&sqlx::Error) -> bool,
) -> crate::StoreError {
    const OPERATION: &str = "applying an inline projection";
    let retry = error.downcast_ref::<sqlx::Error>().is_some_and(retryable);
    let source = InlineFailed {
        name,
        source: error,
    };
    if retry {
        crate::StoreError::unavailable(OPERATION, source)
    } else {
        crate::StoreError::storage(OPERATION, source)
    }
}
