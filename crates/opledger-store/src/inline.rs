//! Inline read models: tables kept in the same transaction as the appends that change them, so a
//! reader that just appended sees its own write (read-your-writes), and a batch whose read model
//! cannot be updated is not committed either.
//!
//! A projection's SQL lives with the projection (`opledger-projections`, `projections/`); the
//! store only calls it at the right moments: once at open (`install`) and inside every append
//! transaction with the batch's events in position order (`apply`).
//!
//! On PostgreSQL a projection may also give the writer an [`InlineWriter`]: it keeps what the
//! writer's committed batches left (the rows they wrote, with the stream versions they were
//! written at) and plans a batch's writes from that before the batch is sent, so that they run
//! in the append's own statement, one round trip in all (ADR 0016). A batch it cannot plan
//! takes the transaction and `apply`, as before.

use std::error::Error as StdError;
use std::fmt::Debug;
use std::sync::Arc;

use crate::backend::Conn;
use crate::chain::Link;
use futures_util::future::BoxFuture;
use sqlx::postgres::PgConnection;

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

    /// A PostgreSQL writer's planner for this projection (one per writer), if it has one; see
    /// [`InlineWriter`]. Without one, every batch with events goes through `apply`.
    fn writer(&self) -> Option<Box<dyn InlineWriter>> {
        None
    }
}

/// A PostgreSQL statement, before its parameters are bound.
pub type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// What a projection writes for one batch, decided before the batch is sent.
pub enum Planned {
    /// The batch changes nothing the projection keeps.
    Nothing,
    /// Its writes, to run in the append's own statement.
    Write(Box<dyn PgWrite>),
    /// It cannot tell its writes without reading inside the append's transaction: the batch
    /// takes the transaction, and [`InlineProjection::apply`].
    Unknown,
}

impl Debug for Planned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Planned::Nothing => "Nothing",
            Planned::Write(_) => "Write",
            Planned::Unknown => "Unknown",
        })
    }
}

/// A projection's planned writes as one part of the append's statement (a data-modifying
/// `WITH` query), which must write only when the append did.
pub trait PgWrite: Send + Sync {
    /// The statement: its parameters numbered from `$first`, writing only the rows for which
    /// the SQL condition `written` is true.
    fn statement(&self, first: usize, written: &str) -> String;

    /// How many parameters it has.
    fn parameters(&self) -> usize;

    /// Binds its parameters, in order.
    fn bind<'q>(&'q self, query: PgQuery<'q>) -> PgQuery<'q>;
}

/// A PostgreSQL writer's planner for one inline projection: what the writer's own committed
/// batches left, so that a batch's writes can be planned without reading under the locks.
///
/// A row it holds is used only for the stream version it was written at. The append checks the
/// versions of the streams it moves under its locks, and a projection's rows change only with
/// their streams (in the same transaction), so a row used that way is the row stored. The
/// writer calls exactly one of [`committed`](Self::committed) or
/// [`discarded`](Self::discarded) after every `plan`.
pub trait InlineWriter: Send + Debug {
    /// Plans the writes for a batch's `events`. It may read on `connection` (outside any
    /// transaction) what it does not hold; what it plans is kept aside until the writer says
    /// whether the batch committed.
    fn plan<'a>(
        &'a mut self,
        connection: &'a mut PgConnection,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<Planned, ProjectionError>>;

    /// The batch last planned is committed: what it wrote is now the projection's state.
    fn committed(&mut self);

    /// The batch last planned is not committed, or may not be: forget what it planned.
    fn discarded(&mut self);
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
