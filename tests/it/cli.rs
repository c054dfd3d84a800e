//! The `opledger` command line, driven as a user would: the real binary, real SQLite files.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use opledger_store::{
    AppendRequest, EventStore, ExpectedVersion, NewEvent, SqliteOptions, SqliteStore, StreamId,
};
use serde_json::{Value, json};
use sqlx::{ConnectOptions, Connection, Executor};

use crate::support::{opledger, opledger_bin, opledger_command, sqlite_url, stderr, stdout};

async fn ledger_with_events(path: &std::path::Path) -> SqliteStore {
    let store = SqliteStore::open(&sqlite_url(path), SqliteOptions::default())
        .await
        .expect("open");
    let event = |n: u64| {
        NewEvent::from_serialize(
            "Received",
            1,
            &json!({ "n": n, "campaign": "spring" }),
            &json!({ "causation": { "kind": "update", "bot": "shop", "update_id": 9_007_199_254_740_993_i64 } }),
        )
        .unwrap()
    };
    for i in 0..3u64 {
        store
            .append(vec![
                AppendRequest::new(
                    StreamId::new(format!("update-shop-{i}")).unwrap(),
                    ExpectedVersion::NoStream,
                    vec![event(i)],
                ),
                AppendRequest::new(
                    StreamId::new("op-coupon-spring:42").unwrap(),
                    ExpectedVersion::Any,
                    vec![event(i)],
                ),
            ])
            .await
            .unwrap();
    }
    store
}

/// Exactly one line on stderr, starting with `error:`, and a failing exit code.
fn assert_one_line_error(output: &std::process::Output, needle: &str) {
    assert!(
        !output.status.success(),
        "expected failure, got {:?}",
        output.status
    );
    let err = stderr(output);
    assert_eq!(err.lines().count(), 1, "one line, got: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "expected `{needle}` in: {err}");
}

#[test]
fn migrate_creates_the_default_ledger_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(opledger_bin())
        .env_clear()
        .current_dir(dir.path())
        .arg("migrate")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(dir.path().join("opledger.db").exists());
    let out = stdout(&output);
    assert!(
        out.contains("sqlite://opledger.db is ready: schema version 3, 0 events"),
        "{out}"
    );
    // Migrating again is a no-op.
    let again = Command::new(opledger_bin())
        .env_clear()
        .current_dir(dir.path())
        .arg("migrate")
        .output()
        .unwrap();
    assert!(again.status.success());
}

#[test]
fn database_url_comes_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("from-env.db");
    let output = Command::new(opledger_bin())
        .env_clear()
        .env("OPLEDGER_DATABASE_URL", sqlite_url(&path))
        .current_dir(dir.path())
        .arg("migrate")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(path.exists());
    assert!(!dir.path().join("opledger.db").exists());
}

#[tokio::test]
async fn events_prints_json_lines_with_the_contract_fields() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let store = ledger_with_events(&path).await;
    let events = store.read_all(1, 100).await.unwrap();
    store.close().await;

    let output = opledger(&sqlite_url(&path), &["events", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let lines: Vec<Value> = stdout(&output)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(lines.len(), 6);
    for (line, event) in lines.iter().zip(&events) {
        assert_eq!(line["position"], event.position);
        assert_eq!(line["stream_id"], event.stream_id.as_str());
        assert_eq!(line["version"], event.version);
        assert_eq!(line["event_type"], "Received");
        assert_eq!(line["schema_version"], 1);
        assert_eq!(line["event_id"], event.event_id.to_string());
        assert_eq!(line["hash"], event.hash.to_hex());
        assert_eq!(line["prev_hash"], event.prev_hash.to_hex());
        assert_eq!(
            serde_json::to_vec(&line["payload"]).unwrap(),
            event.payload,
            "payload is embedded as the stored JSON"
        );
        assert_eq!(
            line["metadata"]["causation"]["update_id"],
            9_007_199_254_740_993_i64
        );
        let recorded_at = line["recorded_at"].as_str().unwrap();
        assert_eq!(
            chrono::DateTime::parse_from_rfc3339(recorded_at).unwrap(),
            event.recorded_at
        );
    }

    let one_stream = opledger(
        &sqlite_url(&path),
        &[
            "events",
            "--json",
            "--stream",
            "op-coupon-spring:42",
            "--from",
            "2",
            "--limit",
            "1",
        ],
    );
    let lines: Vec<Value> = stdout(&one_stream)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["stream_id"], "op-coupon-spring:42");
    assert_eq!(lines[0]["version"], 2);

    let from = opledger(&sqlite_url(&path), &["events", "--json", "--from", "5"]);
    let positions: Vec<u64> = stdout(&from)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["position"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(positions, vec![5, 6]);

    let table = opledger(&sqlite_url(&path), &["events", "--limit", "2"]);
    let table = stdout(&table);
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 3, "header and two rows: {table}");
    assert!(rows[0].contains("POSITION") && rows[0].contains("STREAM@VERSION"));
    assert!(
        rows[1].contains("Received") && rows[1].contains("update-shop-0@1"),
        "{table}"
    );
}

#[tokio::test]
async fn streams_lists_streams_with_versions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    ledger_with_events(&path).await.close().await;
    let output = opledger(
        &sqlite_url(&path),
        &["streams", "--json", "--category", "op"],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let lines: Vec<Value> = stdout(&output)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["stream_id"], "op-coupon-spring:42");
    assert_eq!(lines[0]["category"], "op");
    assert_eq!(lines[0]["version"], 3);
    let table = stdout(&opledger(&sqlite_url(&path), &["streams"]));
    assert_eq!(table.lines().count(), 5, "header and four streams: {table}");
}

#[tokio::test]
async fn events_stops_quietly_when_the_reader_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let store = SqliteStore::open(&sqlite_url(&path), SqliteOptions::default())
        .await
        .unwrap();
    let events: Vec<NewEvent> = (0..5000)
        .map(|n: u64| NewEvent::from_serialize("E", 1, &json!({ "n": n }), &json!({})).unwrap())
        .collect();
    store
        .append(vec![AppendRequest::new(
            StreamId::new("op-many").unwrap(),
            ExpectedVersion::NoStream,
            events,
        )])
        .await
        .unwrap();
    store.close().await;
    let mut child = opledger_command(&sqlite_url(&path), &["events", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let first = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    assert!(first.contains("\"position\":1"));
    // The reader (this test) closed the pipe after one line, like `opledger events | head -1`.
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(output.stderr.is_empty());
}

#[test]
fn bad_url_is_a_clear_error() {
    let output = opledger("mysql://root@127.0.0.1/test", &["events"]);
    assert_one_line_error(&output, "bad database URL");
    let memory = opledger("sqlite::memory:", &["migrate"]);
    assert_one_line_error(&memory, "in-memory database would lose the ledger");
}

#[test]
fn unreachable_database_is_a_clear_error() {
    let output = opledger("sqlite:///nonexistent-opledger-dir/ledger.db", &["migrate"]);
    assert_one_line_error(&output, "cannot reach the database");
}

#[test]
fn a_file_that_is_not_a_ledger_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.db");
    std::fs::write(&path, "these are my notes, not a database").unwrap();
    let output = opledger(&sqlite_url(&path), &["events"]);
    assert_one_line_error(&output, "not an opledger ledger or is damaged");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "these are my notes, not a database",
        "the file is left untouched"
    );
}

#[tokio::test]
async fn read_only_ledger_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    ledger_with_events(&path).await.close().await;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    let mut command = opledger_command(&sqlite_url(&path), &["events"]);
    // Root ignores file permissions; run the binary as an unprivileged user then.
    if std::fs::metadata("/proc/self").unwrap().uid() == 0 {
        command.uid(65534).gid(65534);
    }
    let output = command.output().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_one_line_error(&output, "the database is read-only");
}

#[tokio::test]
async fn schema_newer_than_the_binary_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    ledger_with_events(&path).await.close().await;
    // What a future opledger would leave behind: a migration this binary does not know.
    let mut connection = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    connection
        .execute(
            "INSERT INTO _sqlx_migrations (version, description, installed_on, success, checksum, execution_time) \
             VALUES (99, 'from the future', CURRENT_TIMESTAMP, 1, x'00', 1)",
        )
        .await
        .unwrap();
    connection.close().await.unwrap();
    let output = opledger(&sqlite_url(&path), &["events"]);
    assert_one_line_error(
        &output,
        "schema is newer than this binary (it has migration 99",
    );
    assert_one_line_error(&output, "upgrade opledger");
}

#[tokio::test]
async fn events_from_beyond_every_position_prints_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    ledger_with_events(&path).await.close().await;
    for from in [
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551615",
    ] {
        for extra in [&[][..], &["--stream", "op-coupon-spring:42"][..]] {
            let mut args = vec!["events", "--json", "--from", from];
            args.extend_from_slice(extra);
            let output = opledger(&sqlite_url(&path), &args);
            assert_eq!(output.status.code(), Some(0), "{from}: {}", stderr(&output));
            assert_eq!(stdout(&output), "", "{from} {extra:?}");
            assert_eq!(stderr(&output), "", "{from} {extra:?}");
        }
    }
    let too_big = opledger(
        &sqlite_url(&path),
        &["events", "--from", "18446744073709551616"],
    );
    assert_eq!(too_big.status.code(), Some(2), "{}", stderr(&too_big));
}
