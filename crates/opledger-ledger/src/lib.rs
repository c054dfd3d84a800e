//! The bridge between the pure domain and the event store, shared by every edge that decides
//! (intake, the worker, operator commands).
//!
//! - [`unit_of_work`]: the one door for changes: [`Ledger::unit_of_work`] runs a pure decision on
//!   the states of the streams it asks for, commits what it staged in one atomic append, and
//!   decides again on fresh states after a version conflict (ADR 0009).
//! - [`ledger`]: the pieces underneath: replay a stream into its aggregate ([`load`]), the
//!   expected version of the next append ([`expected`]), decided events as an append request
//!   ([`request`]).
//! - [`clock`]: where the edges read the time that the domain is given as a parameter.
//! - [`failpoint`]: crash points, compiled in only with the `failpoints` feature (crash tests).

pub mod clock;
pub mod failpoint;
pub mod ledger;
pub mod unit_of_work;

pub use clock::{Clock, ManualClock, SystemClock};
pub use ledger::{LedgerError, expected, load, request};
pub use unit_of_work::{
    Changes, Committed, Ledger, LoadError, RetryPolicy, Snapshot, StreamState, Undecided,
    UnitError, UnitOfWork, Unread, Unreadable, replay,
};
