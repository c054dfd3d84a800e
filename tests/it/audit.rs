//! `opledger audit verify|export|head` through the real binary, on both backends (DESIGN §2
//! guarantee 9, §8): an untouched ledger verifies; a changed byte, a deleted row, two swapped
//! rows and a `streams` row that disagrees are each found at the right position with exit code
//! 1 (the append-only triggers are disabled inside the test, as an attacker with database access
//! would); a head kept elsewhere catches a rewrite of the whole chain; an export verifies
//! offline and any change to it (a byte, a line removed, lines swapped, the file's digest) is
//! found and named.

use std::path::Path;
use std::process::Output;

use opledger_store::{AnyStore, AppendRequest, EventStore, ExpectedVersion, NewEvent, StreamId};
use serde_json::{Value, json};
use sqlx::{Connection, Executor};

use crate::support::app::{Backend, Ledger, on_both_backends};
use crate::support::{opledger, stderr, stdout};

on_both_backends!(
    an_untouched_ledger_verifies,
    a_changed_byte_is_found_at_its_position,
    a_deleted_row_is_found_at_its_position,
    swapped_rows_are_found_at_the_lower_position,
    a_streams_row_that_disagrees_with_its_events_is_found,
    a_kept_head_catches_a_rewritten_or_shortened_chain,
    an_export_verifies_offline_with_the_exact_bytes,
    a_changed_export_is_found_and_named,
    head_prints_the_position_and_hash_to_keep,
    the_documented_offline_verifier_agrees,
);

/// Events in a test ledger.
const EVENTS: u64 = 40;

/// A ledger of `EVENTS` events over a few streams, some appended together.
pub(crate) async fn seeded(backend: Backend) -> Option<Ledger> {
    let ledger = Ledger::create(backend).await?;
    let store = ledger.open().await;
    seed(&store, "", EVENTS).await;
    store.close().await;
    Some(ledger)
}

/// Appends `count` events, in calls of one or two streams; `salt` makes the content differ
/// between ledgers.
pub(crate) async fn seed(store: &AnyStore, salt: &str, count: u64) {
    let event = |n: u64| {
        NewEvent::from_serialize(
            "Tested",
            1,
            &json!({ "n": n, "salt": salt, "text": "naïve ünïcode ✓, \"quoted\"\nnew line" }),
            &json!({ "causation": { "kind": "system", "component": "audit-test" } }),
        )
        .expect("event")
    };
    let stream = |name: String| StreamId::new(name).expect("stream id");
    let mut n = 0;
    while n < count {
        let mut requests = vec![AppendRequest::new(
            stream(format!("test-{}", n % 5)),
            ExpectedVersion::Any,
            vec![event(n)],
        )];
        n += 1;
        if n % 3 == 0 && n < count {
            requests.push(AppendRequest::new(
                stream(format!("pair-{salt}{n}")),
                ExpectedVersion::NoStream,
                vec![event(n)],
            ));
            n += 1;
        }
        store.append(requests).await.expect("append");
    }
}

/// SQL run beside opledger with the append-only triggers disabled, as an attacker with access
/// to the database would.
pub(crate) enum Raw {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl Raw {
    pub(crate) async fn open(ledger: &Ledger) -> Raw {
        match ledger {
            Ledger::Sqlite(dir) => {
                use sqlx::ConnectOptions;
                let mut connection = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(dir.path().join("ledger.db"))
                    .connect()
                    .await
                    .expect("open the SQLite file");
                connection
                    .execute("DROP TRIGGER events_refuse_update; DROP TRIGGER events_refuse_delete")
                    .await
                    .expect("drop the triggers");
                Raw::Sqlite(connection)
            }
            Ledger::Postgres(database) => {
                let mut connection = database.connect().await;
                connection
                    .execute("ALTER TABLE events DISABLE TRIGGER events_refuse_update_delete")
                    .await
                    .expect("disable the trigger");
                Raw::Postgres(connection)
            }
            Ledger::Url(_) => panic!("tests tamper with their own ledgers only"),
        }
    }

    pub(crate) async fn execute(&mut self, sql: &str) {
        match self {
            Raw::Sqlite(c) => c
                .execute(sqlx::AssertSqlSafe(sql.to_owned()))
                .await
                .map(|r| r.rows_affected()),
            Raw::Postgres(c) => c
                .execute(sqlx::AssertSqlSafe(sql.to_owned()))
                .await
                .map(|r| r.rows_affected()),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    async fn payload(&mut self, position: u64) -> Vec<u8> {
        let sql = "SELECT payload FROM events WHERE position = $1";
        let position = i64::try_from(position).unwrap();
        match self {
            Raw::Sqlite(c) => sqlx::query_scalar(sql).bind(position).fetch_one(c).await,
            Raw::Postgres(c) => sqlx::query_scalar(sql).bind(position).fetch_one(c).await,
        }
        .expect("read a payload")
    }

    async fn set_payload(&mut self, position: u64, payload: Vec<u8>) {
        let sql = "UPDATE events SET payload = $1 WHERE position = $2";
        let position = i64::try_from(position).unwrap();
        let done = match self {
            Raw::Sqlite(c) => sqlx::query(sql)
                .bind(payload)
                .bind(position)
                .execute(c)
                .await
                .map(|r| r.rows_affected()),
            Raw::Postgres(c) => sqlx::query(sql)
                .bind(payload)
                .bind(position)
                .execute(c)
                .await
                .map(|r| r.rows_affected()),
        };
        assert_eq!(done.expect("change a payload"), 1);
    }

    pub(crate) async fn close(self) {
        match self {
            Raw::Sqlite(c) => c.close().await,
            Raw::Postgres(c) => c.close().await,
        }
        .expect("close");
    }
}

/// `opledger audit verify --json` and its one JSON object.
fn verify_json(url: &str, extra: &[&str]) -> (Output, Value) {
    let mut args = vec!["audit", "verify", "--json"];
    args.extend_from_slice(extra);
    let output = opledger(url, &args);
    let json = serde_json::from_str(stdout(&output).trim())
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&output), stderr(&output)));
    (output, json)
}

/// Asserts that verification failed with exit code 1 at `position`, in the message and the JSON.
fn assert_broken_at(url: &str, position: u64, kind: &str) {
    let (output, json) = verify_json(url, &[]);
    assert_eq!(output.status.code(), Some(1), "{json}");
    assert_eq!(json["ok"], false);
    assert_eq!(json["broken"]["position"], position, "{json}");
    assert_eq!(json["broken"]["kind"], kind, "{json}");
    assert!(
        stderr(&output).contains(&format!("broken at position {position}:")),
        "{}",
        stderr(&output)
    );
    let text = opledger(url, &["audit", "verify"]);
    assert_eq!(text.status.code(), Some(1));
    assert!(
        stderr(&text).contains(&format!("the ledger is broken at position {position}:")),
        "{}",
        stderr(&text)
    );
}

async fn an_untouched_ledger_verifies(backend: Backend) {
    let Some(ledger) = seeded(backend).await else {
        return;
    };
    let url = ledger.url();
    let (output, json) = verify_json(&url, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(json["ok"], true);
    assert_eq!(json["events"], EVENTS);
    assert_eq!(json["head"]["position"], EVENTS);
    assert!(json["broken"].is_null());
    assert!(json["events_per_sec"].as_f64().is_some_and(|r| r > 0.0));
    assert!(json["peak_rss_bytes"].as_u64().is_some_and(|r| r > 0));
    let store = ledger.open().await;
    let head = store.head().await.expect("head");
    store.close().await;
    assert_eq!(json["head"]["hash"], head.hash.to_hex());

    let text = opledger(&url, &["audit", "verify"]);
    assert!(text.status.success(), "{}", stderr(&text));
    assert!(
        stdout(&text).contains(&format!("ok: {EVENTS} events in")),
        "{}",
        stdout(&text)
    );
    assert!(stdout(&text).contains(&head.hash.to_hex()));
}

async fn a_changed_byte_is_found_at_its_position(backend: Backend) {
    let Some(ledger) = seeded(backend).await else {
        return;
    };
    let mut raw = Raw::open(&ledger).await;
    let mut payload = raw.payload(17).await;
    let digit = payload
        .iter()
        .position(u8::is_ascii_digit)
        .expect("a digit");
    payload[digit] = if payload[digit] == b'9' {
        b'8'
    } else {
        payload[digit] + 1
    };
    raw.set_payload(17, payload).await;
    raw.close().await;
    assert_broken_at(&ledger.url(), 17, "hash_mismatch");
}

async fn a_deleted_row_is_found_at_its_position(backend: Backend) {
    let Some(ledger) = seeded(backend).await else {
        return;
    };
    let mut raw = Raw::open(&ledger).await;
    raw.execute("DELETE FROM events WHERE position = 23").await;
    raw.close().await;
    assert_broken_at(&ledger.url(), 23, "position_gap");
}

async fn swapped_rows_are_found_at_the_lower_position(backend: Backend) {
    let Some(ledger) = seeded(backend).await else {
        return;
    };
    let mut raw = Raw::open(&ledger).await;
    // Rows 12 and 30 trade places: every column but the position is swapped.
    raw.execute("UPDATE events SET position = 1000000 WHERE position = 12")
        .await;
    raw.execute("UPDATE events SET position = 12 WHERE position = 30")
        .await;
    raw.execute("UPDATE events SET position = 30 WHERE position = 1000000")
        .await;
    raw.close().await;
    assert_broken_at(&ledger.url(), 12, "broken_link");
}

async fn a_streams_row_that_disagrees_with_its_events_is_found(backend: Backend) {
    let Some(ledger) = seeded(backend).await else {
        return;
    };
    let mut raw = Raw::open(&ledger).await;
    // Raising a version is what the streams triggers allow; the events do not follow.
    raw.execute("UPDATE streams SET version = version + 1 WHERE stream_id = 'test-3'")
        .await;
    raw.close().await;
    let (output, json) = verify_json(&ledger.url(), &[]);
    assert_eq!(output.status.code(), Some(1), "{json}");
    assert_eq!(json["broken"]["kind"], "stream_version", "{json}");
    assert!(
        stderr(&output).contains("the streams table says stream `test-3` is at version"),
        "{}",
        stderr(&output)
    );
}

async fn a_kept_head_catches_a_rewritten_or_shortened_chain(backend: Backend) {
    let Some(ledger) = seeded(backend).await else {
        return;
    };
    let url = ledger.url();
    let head = opledger(&url, &["audit", "head", "--json"]);
    assert!(head.status.success(), "{}", stderr(&head));
    let head: Value = serde_json::from_str(stdout(&head).trim()).expect("JSON");
    let kept = head["checkpoint"].as_str().expect("checkpoint").to_owned();
    assert_eq!(kept, format!("{EVENTS}:{}", head["hash"].as_str().unwrap()));

    // The ledger grows; the kept head is still in its chain.
    let store = ledger.open().await;
    seed(&store, "more", 5).await;
    store.close().await;
    let (output, json) = verify_json(&url, &["--expect-head", &kept]);
    assert!(output.status.success(), "{json}");

    // A ledger rewritten from scratch is consistent in itself, but not with the kept head.
    let Some(rewritten) = Ledger::create(backend).await else {
        return;
    };
    let store = rewritten.open().await;
    seed(&store, "rewritten", EVENTS + 5).await;
    store.close().await;
    let (plain, _) = verify_json(&rewritten.url(), &[]);
    assert!(
        plain.status.success(),
        "the rewrite is consistent in itself"
    );
    let (output, json) = verify_json(&rewritten.url(), &["--expect-head", &kept]);
    assert_eq!(output.status.code(), Some(1), "{json}");
    assert_eq!(json["broken"]["kind"], "checkpoint_mismatch");
    assert_eq!(json["broken"]["position"], EVENTS);
    assert!(stderr(&output).contains("rewritten"), "{}", stderr(&output));

    // A ledger cut short before the kept position.
    let Some(short) = Ledger::create(backend).await else {
        return;
    };
    let store = short.open().await;
    seed(&store, "", 10).await;
    store.close().await;
    let (output, json) = verify_json(&short.url(), &["--expect-head", &kept]);
    assert_eq!(output.status.code(), Some(1), "{json}");
    assert_eq!(json["broken"]["kind"], "checkpoint_missing");
    assert!(stderr(&output).contains("cut short"), "{}", stderr(&output));

    // A kept head that is not POSITION:HASH is a usage error.
    let bad = opledger(&url, &["audit", "verify", "--expect-head", "40:xyz"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("POSITION:HASH"), "{}", stderr(&bad));
}

fn export(url: &str, dir: &Path, extra: &[&str]) -> Output {
    let dir = dir.to_str().expect("UTF-8 path");
    let mut args = vec!["audit", "export", "--out", dir];
    args.extend_from_slice(extra);
    opledger(url, &args)
}

/// `opledger audit verify --export DIR` (with no database URL that could be used).
fn verify_export(dir: &Path) -> Output {
    let dir = dir.to_str().expect("UTF-8 path");
    opledger(
        "sqlite:///nonexistent/opledger.db",
        &["audit", "verify", "--export", dir],
    )
}

async fn an_export_verifies_offline_with_the_exact_bytes(backend: Backend) {
    let Some(ledger) = seeded(backend).await else {
        return;
    };
    let url = ledger.url();
    let store = ledger.open().await;
    let events = store.read_all(1, 1000).await.expect("read");
    let head = store.head().await.expect("head");
    store.close().await;
    let out = tempfile::tempdir().expect("temporary directory");
    for format in ["jsonl", "csv"] {
        let dir = out.path().join(format);
        let output = export(&url, &dir, &["--format", format]);
        assert!(output.status.success(), "{}", stderr(&output));
        let manifest: Value =
            serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(manifest["from"], 1);
        assert_eq!(manifest["to"], EVENTS);
        assert_eq!(manifest["count"], EVENTS);
        assert_eq!(manifest["encoding"], format);
        assert_eq!(manifest["first_prev_hash"], "0".repeat(64));
        assert_eq!(manifest["first_hash"], events[0].hash.to_hex());
        assert_eq!(manifest["last_hash"], head.hash.to_hex());
        let file = std::fs::read(dir.join(format!("events.{format}"))).unwrap();
        assert_eq!(
            manifest["events_sha256"],
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&file))
        );
        let verified = verify_export(&dir);
        assert!(verified.status.success(), "{}", stderr(&verified));
        assert!(stdout(&verified).contains("ok:"), "{}", stdout(&verified));
    }
    // Every stored field, payload and metadata as their exact bytes.
    let jsonl = std::fs::read_to_string(out.path().join("jsonl/events.jsonl")).unwrap();
    let lines: Vec<Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), events.len());
    use base64::Engine;
    let base64 = base64::engine::general_purpose::STANDARD;
    for (line, event) in lines.iter().zip(&events) {
        assert_eq!(line["position"], event.position);
        assert_eq!(line["stream_id"], event.stream_id.as_str());
        assert_eq!(line["version"], event.version);
        assert_eq!(line["event_id"], event.event_id.to_string());
        assert_eq!(line["event_type"], event.event_type);
        assert_eq!(line["schema_version"], event.schema_version);
        assert_eq!(
            base64
                .decode(line["payload_base64"].as_str().unwrap())
                .unwrap(),
            event.payload
        );
        assert_eq!(
            base64
                .decode(line["metadata_base64"].as_str().unwrap())
                .unwrap(),
            event.metadata
        );
        assert_eq!(
            line["recorded_at_micros"],
            event.recorded_at.timestamp_micros()
        );
        assert_eq!(line["prev_hash"], event.prev_hash.to_hex());
        assert_eq!(line["hash"], event.hash.to_hex());
    }

    // A range: its chain hangs on the prev_hash of its first event.
    let range = out.path().join("range");
    let output = export(&url, &range, &["--from", "11", "--to", "20"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(range.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["count"], 10);
    assert_eq!(manifest["first_prev_hash"], events[9].hash.to_hex());
    assert!(verify_export(&range).status.success());

    // A head kept elsewhere is checked against the export too.
    let range_dir = range.to_str().unwrap();
    let with_head = |head: String| {
        opledger(
            "sqlite:///nonexistent/opledger.db",
            &[
                "audit",
                "verify",
                "--export",
                range_dir,
                "--expect-head",
                &head,
            ],
        )
    };
    let kept = format!("20:{}", events[19].hash);
    assert!(with_head(kept).status.success());
    let rewritten = with_head(format!("15:{}", events[19].hash));
    assert_eq!(rewritten.status.code(), Some(1));
    assert!(
        stderr(&rewritten).contains("broken at position 15"),
        "{}",
        stderr(&rewritten)
    );
    let outside = with_head(format!("30:{}", events[29].hash));
    assert_eq!(outside.status.code(), Some(2), "{}", stderr(&outside));

    // A folder with files is refused unless --force.
    let again = export(&url, &range, &[]);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("--force"), "{}", stderr(&again));
    let forced = export(&url, &range, &["--force"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert!(verify_export(&range).status.success());

    // A range beyond the head is a usage error.
    let beyond = export(&url, &out.path().join("beyond"), &["--to", "1000"]);
    assert_eq!(beyond.status.code(), Some(2), "{}", stderr(&beyond));
}

/// Exports the seeded ledger in `format` into a new folder under `root` named `name`.
fn fresh_export(url: &str, root: &Path, name: &str, format: &str) -> std::path::PathBuf {
    let dir = root.join(name);
    let output = export(url, &dir, &["--format", format]);
    assert!(output.status.success(), "{}", stderr(&output));
    dir
}

fn assert_export_broken_at(dir: &Path, position: u64) {
    let output = verify_export(dir);
    assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
    assert!(
        stderr(&output).contains(&format!("is broken at position {position}:")),
        "{}",
        stderr(&output)
    );
}

fn rewrite_lines(file: &Path, change: impl FnOnce(&mut Vec<String>)) {
    let text = std::fs::read_to_string(file).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    change(&mut lines);
    std::fs::write(file, lines.join("\n") + "\n").unwrap();
}

/// Changes one character of line `index`'s base64 payload into another base64 character.
fn change_payload_byte(line: &mut String) {
    let start = line.find("\"payload_base64\":\"").expect("payload") + 20;
    let mut bytes = std::mem::take(line).into_bytes();
    bytes[start] = if bytes[start] == b'A' { b'B' } else { b'A' };
    *line = String::from_utf8(bytes).unwrap();
}

async fn a_changed_export_is_found_and_named(backend: Backend) {
    let Some(ledger) = seeded(backend).await else {
        return;
    };
    let url = ledger.url();
    let root = tempfile::tempdir().expect("temporary directory");

    // One byte of one payload (line 8 holds position 8).
    let dir = fresh_export(&url, root.path(), "byte", "jsonl");
    rewrite_lines(&dir.join("events.jsonl"), |lines| {
        change_payload_byte(&mut lines[7]);
    });
    assert_export_broken_at(&dir, 8);

    // A line removed.
    let dir = fresh_export(&url, root.path(), "removed", "jsonl");
    rewrite_lines(&dir.join("events.jsonl"), |lines| {
        lines.remove(14);
    });
    assert_export_broken_at(&dir, 15);

    // The last line removed: the count and the last hash tell.
    let dir = fresh_export(&url, root.path(), "tail", "jsonl");
    rewrite_lines(&dir.join("events.jsonl"), |lines| {
        lines.pop();
    });
    assert_export_broken_at(&dir, EVENTS);

    // Two lines swapped.
    let dir = fresh_export(&url, root.path(), "swapped", "jsonl");
    rewrite_lines(&dir.join("events.jsonl"), |lines| lines.swap(4, 9));
    assert_export_broken_at(&dir, 5);

    // A change that leaves every line valid (spaces after a record) is caught by the digest.
    let dir = fresh_export(&url, root.path(), "digest", "jsonl");
    rewrite_lines(&dir.join("events.jsonl"), |lines| lines[3].push_str("  "));
    let output = verify_export(&dir);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("SHA-256"), "{}", stderr(&output));

    // The same in CSV: one byte, and a removed record.
    let dir = fresh_export(&url, root.path(), "csv-byte", "csv");
    let file = dir.join("events.csv");
    let text = std::fs::read_to_string(&file).unwrap();
    let mut records: Vec<csv::StringRecord> = csv::Reader::from_reader(text.as_bytes())
        .records()
        .map(Result::unwrap)
        .collect();
    let headers = csv::Reader::from_reader(text.as_bytes())
        .headers()
        .unwrap()
        .clone();
    let payload = headers.iter().position(|h| h == "payload_base64").unwrap();
    let mut fields: Vec<String> = records[20].iter().map(str::to_owned).collect();
    let mut bytes = std::mem::take(&mut fields[payload]).into_bytes();
    bytes[3] = if bytes[3] == b'A' { b'B' } else { b'A' };
    fields[payload] = String::from_utf8(bytes).unwrap();
    records[20] = csv::StringRecord::from(fields);
    let write = |records: &[csv::StringRecord], file: &Path| {
        let mut writer = csv::Writer::from_path(file).unwrap();
        writer.write_record(&headers).unwrap();
        for record in records {
            writer.write_record(record).unwrap();
        }
        writer.flush().unwrap();
    };
    write(&records, &file);
    assert_export_broken_at(&dir, 21);
    let dir = fresh_export(&url, root.path(), "csv-removed", "csv");
    let file = dir.join("events.csv");
    let mut records: Vec<csv::StringRecord> = csv::Reader::from_path(&file)
        .unwrap()
        .records()
        .map(Result::unwrap)
        .collect();
    records.remove(2);
    write(&records, &file);
    assert_export_broken_at(&dir, 3);
}

async fn head_prints_the_position_and_hash_to_keep(backend: Backend) {
    let Some(ledger) = seeded(backend).await else {
        return;
    };
    let url = ledger.url();
    let store = ledger.open().await;
    let head = store.head().await.expect("head");
    store.close().await;
    let output = opledger(&url, &["audit", "head"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains(&format!("position     {EVENTS}")), "{text}");
    assert!(text.contains(&head.hash.to_hex()), "{text}");
    assert!(
        text.contains(&format!(
            "opledger audit verify --expect-head {EVENTS}:{}",
            head.hash
        )),
        "{text}"
    );
    let json = opledger(&url, &["audit", "head", "--json"]);
    let json: Value = serde_json::from_str(stdout(&json).trim()).expect("JSON");
    assert_eq!(json["position"], EVENTS);
    assert_eq!(json["hash"], head.hash.to_hex());
    assert!(json["recorded_at"].is_string());
}

#[tokio::test]
async fn verifying_a_missing_ledger_fails_without_creating_it() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("missing.db");
    let url = crate::support::sqlite_url(&path);
    let output = opledger(&url, &["audit", "verify"]);
    // A ledger that is not there is a usage error, like every read command's (issue 15 D8).
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("cannot open the ledger"),
        "{}",
        stderr(&output)
    );
    assert!(!path.exists(), "verifying never creates a ledger");
}

/// The Python verifier in `docs/audit.md`, so that the documentation stays true.
fn documented_verifier() -> String {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/audit.md"))
        .expect("read docs/audit.md");
    let start = docs.find("```python\n").expect("a Python block") + "```python\n".len();
    let end = start + docs[start..].find("\n```").expect("the block's end");
    docs[start..end].to_owned()
}

async fn the_documented_offline_verifier_agrees(backend: Backend) {
    let python = std::process::Command::new("python3")
        .arg("--version")
        .output();
    if !python.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 is missing under CI"
        );
        eprintln!("SKIPPED: python3 is not installed");
        return;
    }
    let Some(ledger) = seeded(backend).await else {
        return;
    };
    let root = tempfile::tempdir().expect("temporary directory");
    let script = root.path().join("verify_export.py");
    std::fs::write(&script, documented_verifier()).expect("write the script");
    let run = |dir: &Path| {
        std::process::Command::new("python3")
            .arg(&script)
            .arg(dir)
            .output()
            .expect("run python3")
    };
    for format in ["jsonl", "csv"] {
        let dir = fresh_export(&ledger.url(), root.path(), format, format);
        let output = run(&dir);
        assert!(output.status.success(), "{format}: {}", stderr(&output));
        assert!(
            stdout(&output).starts_with("ok: positions 1..=40"),
            "{}",
            stdout(&output)
        );
    }
    let range = root.path().join("range");
    assert!(
        export(&ledger.url(), &range, &["--from", "9", "--to", "30"])
            .status
            .success()
    );
    assert!(run(&range).status.success());
    // A changed payload byte fails it too (once the digest is made to match, it is the hash).
    let dir = fresh_export(&ledger.url(), root.path(), "changed", "jsonl");
    rewrite_lines(&dir.join("events.jsonl"), |lines| {
        change_payload_byte(&mut lines[7])
    });
    let output = run(&dir);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("the file was changed"),
        "{}",
        stderr(&output)
    );
    let manifest_path = dir.join("manifest.json");
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    let file = std::fs::read(dir.join("events.jsonl")).unwrap();
    manifest["events_sha256"] = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&file)).into();
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let output = run(&dir);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("event 8 was altered"),
        "{}",
        stderr(&output)
    );
    // opledger agrees.
    assert_export_broken_at(&dir, 8);
}
