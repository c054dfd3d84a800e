//! The bridge between the pure domain and the event store, shared by every edge that decides
//! (intake, the worker, operator commands).
//!
//! - [`ledger`]: replay a stream into its aggregate ([`load`]), the expected version of the next
//!   append ([`expected`]), decided events as an append request ([`request`]).
//! - [`clock`]: where the edges read the time that the domain is given as a parameter.
//! - [`failpoint`]: crash points, compiled in only with the `failpoints` feature (crash tests).

pub mod clock;
pub mod failpoint;
pub mod ledger;

pub use clock::{Clock, ManualClock, SystemClock};
pub use ledger::{LedgerError, expected, load, request};
