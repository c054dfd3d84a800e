//! The worker's pure decisions, public for callers that batch their own appends (the rebuild
//! benchmark's generator), so that what they write is decided by the code the worker runs.
//!
//! Nothing here does I/O: a [`View`] of an operation's stream (a `StreamState`) and the
//! answers of the outside world go in, commands or events staged in `Changes` come out.
//!
//! - The call step: [`claim_commands`] (the claim, with the call's record when the effector
//!   resolves unknown outcomes itself), [`answered`] and [`unknown_outcome`] (what the
//!   effector's answer, or its absence, makes the worker record), [`stage_outcome`] (staged, or
//!   recorded as a `TransitionRejected` when refused late), and [`OutcomeWithClaim`] (an
//!   outcome committed together with the next claim, ADR 0007).
//! - Replies: [`reply_outcome`], what `sendMessage`'s answer makes the worker record.
//! - [`stage`], [`decide_all`]: commands decided one after the other on a view; [`metadata`]:
//!   a worker's causation and correlation.

pub use crate::call::{OutcomeWithClaim, Resolution, answered, claim_commands, unknown_outcome};
pub use crate::handle::{View, decide_all, metadata, stage, stage_outcome};
pub use crate::reply::reply_outcome;
