//! The commands that only read (`events`, `streams`, `ops`, `reconcile list`, `projections
//! list`, `timeline`, `audit …`, `replay`) open the ledger read-only (issue 15 D8): a mistyped
//! path is an error naming it (exit 2) and creates nothing; a database that is not an opledger
//! ledger, or is one of a newer schema, is refused and left byte for byte as it was. Only the
//! commands that write (`serve`, `worker`, `migrate`, …) create and migrate.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use sha2::{Digest, Sha256};
use sqlx::{ConnectOptions, Connection, Executor};

use crate::support::postgres::TestDatabase;
use crate::support::{opledger, sqlite_url, stderr};

/// Every read command, with the files it would write (exports, replays) under `out`.
fn read_commands(out: &Path) -> Vec<Vec<String>> {
    let export = out.join("export").display().to_string();
    let replay = out.join("replay.db").display().to_string();
    [
        &["events"][..],
        &["events", "--stream", "op-x"],
        &["streams"],
        &["ops"],
        &["reconcile", "list"],
        &["projections", "list"],
        &["timeline", "00000000-0000-4000-8000-000000000000"],
        &["audit", "verify"],
        &["audit", "head"],
        &["audit", "export", "--out", &export],
        &["replay", "--until", "1", "--into", &replay],
    ]
    .iter()
    .map(|args| args.iter().map(|a| (*a).to_owned()).collect())
    .collect()
}

fn run(url: &str, args: &[String]) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    opledger(url, &args)
}

/// Exactly one line on stderr holding every `needle`, and exit code `code`.
fn assert_refused(output: &Output, code: i32, needles: &[&str], what: &[String]) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(code), "{what:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{what:?}: one line, got {err}");
    for needle in needles {
        assert!(
            err.contains(needle),
            "{what:?}: expected `{needle}` in {err}"
        );
    }
}

/// Every file in `dir` with the SHA-256 of its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .expect("list the directory")
        .map(|entry| {
            let entry = entry.expect("an entry");
            let bytes = std::fs::read(entry.path()).unwrap_or_default();
            let digest = hex::encode(Sha256::digest(&bytes));
            (entry.file_name().to_string_lossy().into_owned(), digest)
        })
        .collect()
}

#[test]
fn a_mistyped_sqlite_path_is_an_error_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let path = dir.path().join("typo.db");
    for args in read_commands(out.path()) {
        let output = run(&sqlite_url(&path), &args);
        assert_refused(
            &output,
            2,
            &[
                &format!("there is no ledger at {}", path.display()),
                "create it with `opledger migrate`",
            ],
            &args,
        );
        assert!(snapshot(dir.path()).is_empty(), "{args:?} created a file");
        assert!(snapshot(out.path()).is_empty(), "{args:?} wrote a file");
    }
    // The commands that write still create the ledger.
    let migrated = opledger(&sqlite_url(&path), &["migrate"]);
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    let events = opledger(&sqlite_url(&path), &["events"]);
    assert!(events.status.success(), "{}", stderr(&events));
}

/// Someone else's SQLite file, in rollback-journal or WAL mode.
async fn foreign_database(path: &Path, wal: bool) {
    let mut connection = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(if wal {
            sqlx::sqlite::SqliteJournalMode::Wal
        } else {
            sqlx::sqlite::SqliteJournalMode::Delete
        })
        .connect()
        .await
        .unwrap();
    connection
        .execute(
            "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL); \
             INSERT INTO notes (text) VALUES ('buy milk'), ('call mum')",
        )
        .await
        .unwrap();
    connection.close().await.unwrap();
}

#[tokio::test]
async fn someone_elses_sqlite_file_is_refused_and_left_untouched() {
    for wal in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let path = dir.path().join("notes.db");
        foreign_database(&path, wal).await;
        let before = snapshot(dir.path());
        for args in read_commands(out.path()) {
            let output = run(&sqlite_url(&path), &args);
            assert_refused(&output, 1, &["not an opledger ledger"], &args);
            assert_eq!(
                snapshot(dir.path()),
                before,
                "{args:?} (WAL: {wal}) changed it"
            );
            assert!(snapshot(out.path()).is_empty(), "{args:?} wrote a file");
        }
    }
}

#[tokio::test]
async fn a_sqlite_ledger_of_a_newer_schema_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let migrated = opledger(&sqlite_url(&path), &["migrate"]);
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    let mut connection = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    connection.execute(FUTURE_MIGRATION).await.unwrap();
    connection.close().await.unwrap();
    let before = snapshot(dir.path());
    for args in read_commands(out.path()) {
        let output = run(&sqlite_url(&path), &args);
        assert_refused(
            &output,
            1,
            &[
                "schema is newer than this binary (it has migration 99",
                "upgrade opledger",
            ],
            &args,
        );
        assert_eq!(snapshot(dir.path()), before, "{args:?} changed the ledger");
    }
}

/// What a future opledger would leave behind: a migration this binary does not know.
const FUTURE_MIGRATION: &str = "INSERT INTO _sqlx_migrations \
     (version, description, installed_on, success, checksum, execution_time) \
     VALUES (99, 'from the future', CURRENT_TIMESTAMP, true, x'00', 1)";
/// The same on PostgreSQL, whose byte strings are written differently.
const FUTURE_MIGRATION_PG: &str = "INSERT INTO _sqlx_migrations \
     (version, description, installed_on, success, checksum, execution_time) \
     VALUES (99, 'from the future', now(), true, '\\x00', 1)";

/// The tables of a PostgreSQL database's public schema.
async fn tables(database: &TestDatabase) -> Vec<String> {
    let mut connection = database.connect().await;
    let names = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = 'public' ORDER BY 1",
    )
    .fetch_all(&mut connection)
    .await
    .unwrap();
    connection.close().await.unwrap();
    names
}

#[tokio::test]
async fn an_empty_postgres_database_is_refused_and_gets_no_schema() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let out = tempfile::tempdir().unwrap();
    for args in read_commands(out.path()) {
        let output = run(database.url(), &args);
        assert_refused(&output, 1, &["not an opledger ledger"], &args);
        assert!(
            tables(&database).await.is_empty(),
            "{args:?} created tables"
        );
        assert!(snapshot(out.path()).is_empty(), "{args:?} wrote a file");
    }
}

#[tokio::test]
async fn a_postgres_ledger_of_a_newer_schema_is_refused() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let migrated = opledger(database.url(), &["migrate"]);
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    let mut connection = database.connect().await;
    connection.execute(FUTURE_MIGRATION_PG).await.unwrap();
    connection.close().await.unwrap();
    let before = tables(&database).await;
    let out = tempfile::tempdir().unwrap();
    for args in read_commands(out.path()) {
        let output = run(database.url(), &args);
        assert_refused(
            &output,
            1,
            &["schema is newer than this binary (it has migration 99"],
            &args,
        );
    }
    assert_eq!(tables(&database).await, before);
}
