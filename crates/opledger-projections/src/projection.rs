//! What a projection is: a name, a schema per backend, and a deterministic fold of events into
//! its tables, applied inside a transaction the runner owns.
//!
//! The same [`Projection::apply`] serves the live runner (pages after the checkpoint), blue/green
//! rebuilds (from position 0 into `name@vN` tables), point-in-time replays (into a separate
//! SQLite file) and, for `operation_status`, the store's inline updates. A projection touches
//! only its own tables and calls nothing outside the database, so running it again repeats
//! nothing.
//!
//! # Table names
//!
//! A projection's schema is SQL text with two placeholders:
//! - `{table}`: the name of its main table; other tables are `{table}_suffix` (listed by
//!   [`Projection::tables`]). The active version's tables carry the projection's name
//!   (`audit_trail`, `audit_trail_…`); a version being built carries `audit_trail@v3`
//!   (`audit_trail@v3_…`) until the flip renames it. Always write it quoted: `"{table}"`,
//!   `"{table}_ops"`.
//! - `{index}`: a prefix for index names, unique per version (`audit_trail@v3`), which a flip
//!   does not rename. Write `"{index}_by_user"`.
//!
//! A line `-- indexes` splits the text: what comes after it is created once the tables are
//! filled (a rebuild loads rows first and indexes them at the end, which is faster).

use std::fmt::Debug;

use futures_util::future::BoxFuture;
use opledger_store::chain::Link;
use opledger_store::inline::ProjectionError;
pub use opledger_store::{Backend, Conn};
use sha2::{Digest, Sha256};

/// A projection's schema, one SQL text per backend (see the module documentation for its
/// placeholders).
#[derive(Clone, Copy, Debug)]
pub struct Schema {
    pub sqlite: &'static str,
    pub postgres: &'static str,
}

impl Schema {
    /// The text for `backend`.
    pub fn text(&self, backend: Backend) -> &'static str {
        match backend {
            Backend::Sqlite => self.sqlite,
            Backend::Postgres => self.postgres,
        }
    }

    /// The statements that create the tables (before the `-- indexes` line) and those that
    /// create the indexes (after it), for tables named `table` and indexes prefixed `index`.
    pub fn render(&self, backend: Backend, table: &str, index: &str) -> (String, String) {
        let text = self.text(backend);
        let (tables, indexes) = text
            .split_once(INDEXES_MARKER)
            .map_or((text, ""), |(t, i)| (t, i));
        let fill = |sql: &str| sql.replace("{table}", table).replace("{index}", index);
        (fill(tables), fill(indexes))
    }
}

/// The line that separates tables from indexes in a schema file.
pub const INDEXES_MARKER: &str = "\n-- indexes\n";

/// What names a projection and gives its tables their meaning: everything but the fold.
#[derive(Clone, Copy, Debug)]
pub struct Definition {
    /// A stable name: `[a-z_]+`, also its main table's name once active.
    pub name: &'static str,
    /// Bumped whenever the fold's meaning changes; part of the definition hash, with the
    /// schema, so that a changed definition is rebuilt.
    pub code_version: u32,
    /// The schema per backend.
    pub schema: Schema,
    /// The suffixes of the projection's tables after `{table}`: `""` for the main one, e.g.
    /// `"_ops"` for `"{table}_ops"`. A flip renames each.
    pub tables: &'static [&'static str],
    /// Whether the store keeps it inside every append transaction (only `operation_status`):
    /// its flips happen under the ledger's write lock and it has no runner of its own.
    pub inline: bool,
}

impl Definition {
    /// An asynchronous projection with one table, `{table}`.
    pub const fn new(
        name: &'static str,
        code_version: u32,
        sqlite: &'static str,
        postgres: &'static str,
    ) -> Definition {
        Definition {
            name,
            code_version,
            schema: Schema { sqlite, postgres },
            tables: &[""],
            inline: false,
        }
    }

    /// The same with these table suffixes (`""` first, for the main table).
    pub const fn with_tables(self, tables: &'static [&'static str]) -> Definition {
        Definition { tables, ..self }
    }

    /// The same, kept inline by the store.
    pub const fn inline(self) -> Definition {
        Definition {
            inline: true,
            ..self
        }
    }
}

/// A read model: a deterministic fold of the ledger's events into tables.
pub trait Projection: Send + Sync + Debug + 'static {
    /// Its name, version, schema and tables.
    fn definition(&self) -> Definition;

    /// [`Definition::name`].
    fn name(&self) -> &'static str {
        self.definition().name
    }

    /// [`Definition::code_version`].
    fn code_version(&self) -> u32 {
        self.definition().code_version
    }

    /// [`Definition::schema`].
    fn schema(&self) -> Schema {
        self.definition().schema
    }

    /// [`Definition::tables`].
    fn tables(&self) -> &'static [&'static str] {
        self.definition().tables
    }

    /// [`Definition::inline`].
    fn inline(&self) -> bool {
        self.definition().inline
    }

    /// Applies events, contiguous and in position order, to the tables named `table` (a
    /// quoted-identifier-safe name such as `audit_trail` or `audit_trail@v3`), inside the
    /// caller's transaction.
    fn apply<'a>(
        &'a self,
        conn: Conn<'a>,
        table: &'a str,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>>;

    /// Removes everything one stream contributed to the tables named `table`, so that applying
    /// the stream's events again rebuilds just that stream (a targeted rebuild). `None` if the
    /// projection aggregates across streams and can only be rebuilt whole.
    fn forget_stream<'a>(
        &'a self,
        _conn: Conn<'a>,
        _table: &'a str,
        _stream: &'a str,
    ) -> Option<BoxFuture<'a, Result<(), ProjectionError>>> {
        None
    }
}

/// The hash stored with a projection's checkpoint: its name, code version and schema for the
/// backend. A different hash at start means the definition changed and the projection is
/// rebuilt.
pub fn definition_hash(projection: &dyn Projection, backend: Backend) -> String {
    let mut hash = Sha256::new();
    hash.update(projection.name().as_bytes());
    hash.update([0]);
    hash.update(projection.code_version().to_be_bytes());
    hash.update(projection.schema().text(backend).as_bytes());
    hex::encode(hash.finalize())
}

/// Whether `stream_id` belongs to `category` (the part before the first `-`).
pub fn in_category(stream_id: &str, category: &str) -> bool {
    stream_id.split_once('-').map_or(stream_id, |(c, _)| c) == category
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_renders_tables_and_indexes_apart() {
        let schema = Schema {
            sqlite: "CREATE TABLE \"{table}\" (a);\n-- indexes\nCREATE INDEX \"{index}_a\" ON \"{table}\" (a);\n",
            postgres: "",
        };
        let (tables, indexes) = schema.render(Backend::Sqlite, "t@v2", "t@v2");
        assert_eq!(tables, "CREATE TABLE \"t@v2\" (a);");
        assert_eq!(indexes, "CREATE INDEX \"t@v2_a\" ON \"t@v2\" (a);\n");
    }
}
