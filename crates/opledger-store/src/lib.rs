//! opledger's event store: an append-only, globally ordered, hash-chained log of events with
//! optimistic concurrency per stream.
//!
//! - [`EventStore`] is the contract; [`SqliteStore`] is the embedded backend, [`PgStore`] the
//!   one several instances share; [`AnyStore`] picks one from a database URL, and
//!   [`Either`] with [`either!`] is how code says "either backend" once.
//! - Appends are group-committed ([`GroupCommitOptions`]): concurrent calls share one durable
//!   transaction, and each caller gets its own result.
//! - [`Priority`]: in one process, background work (the worker, the read models) waits its
//!   turn while foreground work (intake) is in flight, so acknowledgements stay fast.
//! - Positions are gapless and in commit order, so "the last position I saw" is a safe cursor.
//! - [`chain`] defines the SHA-256 hash chain that makes the history tamper-evident;
//!   [`verify`] checks a whole ledger against it, through a read-only [`LedgerReader`].
//!
//! Architecture invariant: this crate knows nothing of operations, Telegram or any event's
//! meaning; payloads are opaque JSON bytes.

mod any;
mod attachments;
mod backend;
mod batch;
pub mod chain;
mod columns;
mod error;
mod group_commit;
pub mod inline;
mod ledger_files;
mod model;
pub mod postgres;
mod priority;
mod read;
pub mod read_models;
mod reader;
pub mod sqlite;
mod store;
mod tail;
pub mod timings;
pub mod verify;

pub use any::{AnyOptions, AnyStore};
pub use backend::{Backend, Conn, Either, EitherRow, OwnedConn, ReadPool, TextList, Time, Txn};
pub use chain::Hash;
pub use error::{InvalidRequest, OpenError, PositionGap, SharedSource, StoreError};
pub use group_commit::GroupCommitOptions;
pub use inline::{InlineProjection, InlineProjections};
pub use model::{
    AppendRequest, Appended, Attachment, ExpectedVersion, Head, MAX_EVENT_TYPE_LEN,
    MAX_STREAM_ID_LEN, NewEvent, Position, RecordedEvent, StreamId, StreamInfo, StreamVersion,
    empty_object, event_id,
};
pub use postgres::{PgOptions, PgStore};
pub use priority::{Foreground, Priority};
pub use reader::LedgerReader;
pub use sqlite::{Durability, SqliteOptions, SqliteStore};
pub use store::{EventStore, HeadWatch};
pub use tail::Tail;
pub use timings::{AppendTimings, Latencies};
