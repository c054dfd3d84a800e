//! `opledger timeline` and `opledger replay` through the real binary, on both backends (issue 6
//! §4, DESIGN §8): real operation lifecycles (the webhook, the worker against a fake service,
//! an operator's decision) make the ledger; the timeline shows each event with its cause; a
//! replay in the middle equals the read models of the ledger as it was then and holds nothing
//! later; a replay at the head equals the live `operation_status` row for row; the time form
//! picks the last event at or before it; the live ledger is never touched.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::{SecondsFormat, TimeDelta, Utc};
use opledger_config::Config;
use opledger_projections::operation_status::{self, Filter, OperationStatusRow};
use opledger_server::ManualClock;
use opledger_store::{EventStore, ReadPool};
use opledger_worker::Worker;
use serde_json::Value;
use sqlx::{ConnectOptions, Connection, Row};

use crate::support::app::{Backend, Ledger, TOKEN, TestApp, message_from, on_both_backends};
use crate::support::fake_service::{Behaviour, FakeService};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::{opledger, opledger_command, stderr, stdout};

on_both_backends!(
    the_timeline_shows_every_event_with_its_cause,
    a_replay_in_the_middle_is_the_ledger_as_it_was_then,
    bad_until_values_are_usage_errors,
    a_replay_never_writes_over_a_ledger,
);

/// The service, a worker and the fake outside world, on a fresh ledger.
struct World {
    ledger: Ledger,
    app: TestApp,
    service: FakeService,
    _telegram: FakeTelegram,
    config: Config,
}

impl World {
    async fn start(backend: Backend) -> Option<World> {
        let ledger = Ledger::create(backend).await?;
        let service = FakeService::start(false).await;
        let telegram = FakeTelegram::start(TOKEN).await;
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\
             [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
             webhook_secret_env = \"SHOP_SECRET\"\napi_base_url = \"{api}\"\n\
             [[actions]]\nname = \"coupon\"\nbot = \"shop\"\ncommand = \"coupon\"\n\
             params = [\"campaign\"]\nkey = \"{{campaign}}:{{user_id}}\"\n\
             [actions.effector]\nurl = \"{url}\"\ntimeout_ms = 300\n\
             [actions.reply]\nconfirmed = \"Your coupon: {{result.code}}\"\n\
             failed = \"Sorry: {{error}}\"\n",
            api = telegram.base_url(),
            url = service.url(),
        );
        let env: HashMap<&str, &str> = HashMap::from([
            ("SHOP_TOKEN", TOKEN),
            ("SHOP_SECRET", crate::support::app::SECRET),
        ]);
        let config = Config::parse(&text, &|name| env.get(name).map(|v| (*v).to_owned()))
            .expect("test config");
        // Due times come from the database clock: the manual clock runs a little ahead.
        let clock = Arc::new(ManualClock::new(Utc::now() + TimeDelta::seconds(5)));
        let app = TestApp::spawn_with_clock(&ledger, &config, clock).await;
        Some(World {
            ledger,
            app,
            service,
            _telegram: telegram,
            config,
        })
    }

    fn worker(&self) -> Worker {
        self.app.worker(&self.config, "w1", 2)
    }

    /// `/coupon <campaign>` from `user` as update `update_id`.
    async fn ask(&self, update_id: i64, user: i64, campaign: &str) {
        let body = message_from(
            update_id,
            1_790_000_000,
            user,
            &format!("/coupon {campaign}"),
        );
        assert_eq!(self.app.deliver(body).await.status(), 200);
    }

    /// Runs the worker until nothing is due, the clock a minute further each round.
    async fn work(&self) {
        let worker = self.worker();
        for _ in 0..4 {
            self.app.clock.advance(TimeDelta::seconds(60));
            worker.run_due().await.expect("work");
        }
    }

    async fn operation(&self, key: &str) -> OperationStatusRow {
        operations(self.app.store.reader())
            .await
            .into_iter()
            .find(|row| row.business_key == key)
            .unwrap_or_else(|| panic!("no operation {key}"))
    }

    async fn head(&self) -> u64 {
        self.app.store.head().await.expect("head").position
    }
}

async fn operations(pool: ReadPool<'_>) -> Vec<OperationStatusRow> {
    let mut rows = operation_status::list(
        pool,
        &Filter {
            limit: 10_000,
            ..Filter::default()
        },
    )
    .await
    .expect("read operation_status");
    rows.sort_by(|a, b| a.operation_id.cmp(&b.operation_id));
    rows
}

/// One operation through its whole life: received, claimed, sent, unknown outcome (the service
/// failed after acting) and marked for reconciliation by the worker, delivered twice by
/// Telegram, resolved by an operator, replied to.
async fn lifecycle(world: &World) -> OperationStatusRow {
    world.service.script([Behaviour::CreateThenFail(500)]);
    world.ask(1, 7, "spring").await;
    world.work().await;
    let row = world.operation("spring:7").await;
    assert_eq!(row.status, "needs_reconciliation");
    world.ask(1, 7, "spring").await; // Telegram's redelivery.
    let resolved = opledger(
        &world.ledger.url(),
        &[
            "reconcile",
            "resolve",
            &row.operation_id,
            "--outcome",
            "succeeded",
            "--external-id",
            "cpn_found",
            "--operator",
            "alice",
            "--note",
            "found it in the shop's back office",
        ],
    );
    assert!(resolved.status.success(), "{}", stderr(&resolved));
    world.work().await;
    let row = world.operation("spring:7").await;
    assert_eq!(
        (row.status.as_str(), row.reply.as_str()),
        ("reconciled", "sent")
    );
    row
}

async fn the_timeline_shows_every_event_with_its_cause(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let row = lifecycle(&world).await;
    // Another operation's events must not show up.
    world.ask(2, 8, "spring").await;
    world.work().await;
    let url = world.ledger.url();

    let output = opledger(&url, &["timeline", &row.operation_id, "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let entries: Vec<Value> = stdout(&output)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let types: Vec<&str> = entries
        .iter()
        .map(|e| e["event_type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "UpdateReceived",
            "Received",
            "Claimed",
            "ExternalCallSent",
            "MarkedForReconciliation",
            "DuplicateDeliveryObserved",
            "Reconciled",
            "ReplyStarted",
            "ReplySent",
        ],
        "{entries:#?}"
    );
    let positions: Vec<u64> = entries
        .iter()
        .map(|e| e["position"].as_u64().unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    let by_type = |t: &str| entries.iter().find(|e| e["event_type"] == t).unwrap();
    assert_eq!(by_type("Received")["cause"]["kind"], "update");
    assert_eq!(by_type("Received")["cause"]["update_id"], 1);
    assert_eq!(by_type("Received")["stream_id"], row.stream_id);
    assert_eq!(by_type("UpdateReceived")["stream_id"], "update-shop-1");
    let claimed = by_type("Claimed");
    assert_eq!(claimed["cause"]["kind"], "worker");
    assert_eq!(claimed["cause"]["worker"], "w1");
    assert_eq!(claimed["details"]["attempt"], 1);
    assert_eq!(claimed["details"]["worker"], "w1");
    assert!(claimed["details"]["lease_until"].is_string());
    assert_eq!(claimed["correlation"], "update-shop-1");
    assert!(
        by_type("MarkedForReconciliation")["details"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("500")),
        "{entries:#?}"
    );
    let reconciled = by_type("Reconciled");
    assert_eq!(reconciled["cause"]["kind"], "operator");
    assert_eq!(reconciled["cause"]["operator"], "alice");
    assert_eq!(reconciled["details"]["external_id"], "cpn_found");
    assert_eq!(reconciled["version"], 5);
    assert!(
        by_type("Received")["details"].get("fingerprint").is_none(),
        "digests are left out"
    );

    // The table, by stream id this time.
    let output = opledger(&url, &["timeline", &row.stream_id]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    for needle in [
        row.operation_id.as_str(),
        "update shop/1",
        "worker w1",
        "operator alice",
        "external_id=cpn_found",
        "update-shop-1@2",
    ] {
        assert!(text.contains(needle), "{needle} in:\n{text}");
    }
    assert_eq!(text.lines().count(), 2 + entries.len(), "{text}");

    // An unknown operation says how to list them.
    for unknown in [
        "5f0d9e4a-0000-4000-8000-000000000000",
        "op-coupon-nothing",
        "xyz",
    ] {
        let output = opledger(&url, &["timeline", unknown]);
        assert_eq!(output.status.code(), Some(1), "{unknown}");
        assert!(
            stderr(&output).contains("opledger ops"),
            "{unknown}: {}",
            stderr(&output)
        );
    }
    world.app.stop().await;
}

/// Opens a replay file.
async fn open_file(path: &Path) -> sqlx::SqliteConnection {
    sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .connect()
        .await
        .expect("open the replay file")
}

/// The projection tables of a replay file (everything but `replay_info`).
async fn tables(path: &Path) -> Vec<String> {
    let mut file = open_file(path).await;
    let names = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'replay_info' ORDER BY name",
    )
    .fetch_all(&mut file)
    .await
    .expect("list tables");
    file.close().await.ok();
    names
}

/// Asserts that two replay files hold the same projection tables with the same rows.
async fn assert_same_tables(a: &Path, b: &Path) {
    let names = tables(a).await;
    assert_eq!(names, tables(b).await);
    assert!(names.iter().any(|n| n == "operation_status"), "{names:?}");
    let mut file = open_file(a).await;
    sqlx::query("ATTACH DATABASE $1 AS other")
        .bind(b.to_str().unwrap())
        .execute(&mut file)
        .await
        .expect("attach");
    for name in &names {
        let count = |sql: String| sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql));
        let left: i64 = count(format!("SELECT count(*) FROM main.\"{name}\""))
            .fetch_one(&mut file)
            .await
            .unwrap();
        let right: i64 = count(format!("SELECT count(*) FROM other.\"{name}\""))
            .fetch_one(&mut file)
            .await
            .unwrap();
        let differ: i64 = count(format!(
            "SELECT count(*) FROM (SELECT * FROM main.\"{name}\" EXCEPT SELECT * FROM other.\"{name}\")"
        ))
        .fetch_one(&mut file)
        .await
        .unwrap();
        assert_eq!((left, differ), (right, 0), "table {name}");
    }
    file.close().await.ok();
}

/// `replay_info` of a replay file.
async fn info(path: &Path) -> HashMap<String, Value> {
    let mut file = open_file(path).await;
    let row = sqlx::query(
        "SELECT until_position, until_hash, until_time, requested, events, source, built_at \
         FROM replay_info",
    )
    .fetch_one(&mut file)
    .await
    .expect("replay_info");
    let mut info = HashMap::new();
    info.insert("until_position".into(), Value::from(row.get::<i64, _>(0)));
    for (i, name) in ["until_hash", "until_time", "requested"].iter().enumerate() {
        info.insert((*name).into(), Value::from(row.get::<String, _>(i + 1)));
    }
    info.insert("events".into(), Value::from(row.get::<i64, _>(4)));
    info.insert("source".into(), Value::from(row.get::<String, _>(5)));
    info.insert("built_at".into(), Value::from(row.get::<String, _>(6)));
    file.close().await.ok();
    info
}

fn replay(url: &str, until: &str, into: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["replay", "--until", until, "--into", into.to_str().unwrap()];
    args.extend_from_slice(extra);
    opledger(url, &args)
}

/// The SQLite ledger file's bytes (empty on PostgreSQL).
fn ledger_bytes(ledger: &Ledger) -> Vec<u8> {
    match ledger {
        Ledger::Sqlite(dir) => std::fs::read(dir.path().join("ledger.db")).expect("read"),
        _ => Vec::new(),
    }
}

async fn a_replay_in_the_middle_is_the_ledger_as_it_was_then(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let url = world.ledger.url();
    let out = tempfile::tempdir().expect("temporary directory");
    lifecycle(&world).await;
    world.ask(2, 8, "spring").await; // Received, not yet worked on.
    let middle = world.head().await;
    let middle_event = world.app.store.read_all(middle, 1).await.expect("read");
    let middle_time = middle_event[0].recorded_at;
    let as_then = out.path().join("as-then.db");
    let built = replay(&url, &middle.to_string(), &as_then, &[]);
    assert!(built.status.success(), "{}", stderr(&built));
    let text = stdout(&built);
    assert!(
        text.contains(&format!("replayed {middle} events")),
        "{text}"
    );
    assert!(text.contains("operation_status"), "{text}");

    // Later events: the second operation is carried out, a third one arrives.
    tokio::time::sleep(Duration::from_millis(20)).await;
    world.work().await;
    world.ask(3, 9, "summer").await;
    world.work().await;
    let head = world.head().await;
    assert!(head > middle + 5);
    let live = operations(world.app.store.reader()).await;
    world.app.stop().await;

    // The ledger as it is now: nothing below changes it.
    let bytes = ledger_bytes(&world.ledger);
    let store = world.ledger.open().await;
    let live_head = store.head().await.expect("head");
    store.close().await;

    let mid = out.path().join("mid.db");
    let built = replay(&url, &middle.to_string(), &mid, &[]);
    assert!(built.status.success(), "{}", stderr(&built));
    assert_same_tables(&mid, &as_then).await;
    let mid_info = info(&mid).await;
    assert_eq!(mid_info["until_position"], middle);
    assert_eq!(mid_info["events"], middle);
    assert_eq!(mid_info["until_hash"], middle_event[0].hash.to_hex());
    assert_eq!(mid_info["requested"], middle.to_string());
    assert!(!mid_info["source"].as_str().unwrap().is_empty());
    assert!(mid_info["built_at"].is_string());
    let mut file = open_file(&mid).await;
    let pool_rows = {
        // The mid replay holds the second operation as received and no third one.
        let statuses: Vec<(String, String)> = sqlx::query_as(
            "SELECT business_key, status FROM operation_status ORDER BY business_key",
        )
        .fetch_all(&mut file)
        .await
        .expect("read");
        statuses
    };
    file.close().await.ok();
    assert_eq!(
        pool_rows,
        [
            ("spring:7".to_owned(), "reconciled".to_owned()),
            ("spring:8".to_owned(), "received".to_owned()),
        ]
    );

    // At the head: operation_status equals the live one row for row.
    let now = out.path().join("now.db");
    let built = replay(&url, &head.to_string(), &now, &[]);
    assert!(built.status.success(), "{}", stderr(&built));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&now)
                .read_only(true),
        )
        .await
        .expect("open the replay");
    let replayed = operations(ReadPool::Sqlite(&pool)).await;
    pool.close().await;
    assert_eq!(replayed.len(), 3);
    assert_eq!(replayed, live);

    // The time form: the last event recorded at or before it.
    let at = out.path().join("at.db");
    let time = middle_time.to_rfc3339_opts(SecondsFormat::Micros, true);
    let built = replay(&url, &time, &at, &[]);
    assert!(built.status.success(), "{}", stderr(&built));
    assert_eq!(info(&at).await["until_position"], middle);
    assert_same_tables(&at, &as_then).await;

    // An existing file is replaced only with --force; without it, a usage error like the other
    // refusals of the target (exit code 2).
    let again = replay(&url, &middle.to_string(), &mid, &[]);
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("--force"), "{}", stderr(&again));
    let forced = replay(&url, "3", &mid, &["--force"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert_eq!(info(&mid).await["until_position"], 3);

    // Without --into: replay-<position>.db in the current directory.
    let cwd = tempfile::tempdir().expect("temporary directory");
    let built = opledger_command(&url, &["replay", "--until", &middle.to_string()])
        .current_dir(cwd.path())
        .output()
        .expect("run opledger");
    assert!(built.status.success(), "{}", stderr(&built));
    assert_same_tables(&cwd.path().join(format!("replay-{middle}.db")), &as_then).await;

    // The live ledger is untouched.
    assert_eq!(
        ledger_bytes(&world.ledger),
        bytes,
        "the ledger file is unchanged"
    );
    let store = world.ledger.open().await;
    assert_eq!(store.head().await.expect("head"), live_head);
    store.close().await;
}

async fn bad_until_values_are_usage_errors(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    let head = world.head().await;
    let first = world.app.store.read_all(1, 1).await.expect("read")[0].recorded_at;
    world.app.stop().await;
    let url = world.ledger.url();
    let out = tempfile::tempdir().expect("temporary directory");
    let into = out.path().join("bad.db");
    let before = (first - TimeDelta::seconds(3600)).to_rfc3339();
    for (until, says) in [
        ("yesterday", "RFC 3339"),
        ("0", "start at 1"),
        ("12abc", "RFC 3339"),
        ("2026-13-45T00:00:00Z", "RFC 3339"),
        ("1000000", "beyond the ledger's head"),
        (before.as_str(), "no event was recorded at or before"),
    ] {
        let output = replay(&url, until, &into, &[]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{until}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(says),
            "{until}: {}",
            stderr(&output)
        );
        assert!(!into.exists(), "{until}: nothing is written");
    }
    assert!(head >= 2);
}

/// Bytes of a file, or `None` if it is not there.
fn bytes(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}

/// A replay with `--force` refused with exit code 2 and one line saying `says`.
fn assert_refused(url: &str, into: &Path, says: &str) {
    let output = replay(url, "2", into, &["--force"]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{}: {err}", into.display());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(says),
        "{}: expected `{says}` in {err}",
        into.display()
    );
}

/// [`assert_refused`], and the file at `into` (not the live ledger's) left as it was.
fn assert_refused_untouched(url: &str, into: &Path, says: &str) {
    let before = bytes(into);
    assert_refused(url, into, says);
    assert!(bytes(into) == before, "{} was changed", into.display());
}

/// `opledger replay --into <the ledger> --force` used to replace the ledger with the replay
/// (issue 15 D2). It never writes over the ledger it reads, by any path, nor its journal files,
/// nor any other ledger, nor a file that no replay made, while the service keeps acknowledging
/// updates into the ledger; `--force` replaces only an earlier replay.
async fn a_replay_never_writes_over_a_ledger(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    for update in 1..=5 {
        world.ask(update, 7, &format!("spring{update}")).await;
    }
    let url = world.ledger.url();
    let out = tempfile::tempdir().expect("temporary directory");
    let ledger_refusal = "is the ledger being replayed or one of its journal files";

    if let Ledger::Sqlite(dir) = &world.ledger {
        // The service is running: its write-ahead log and shared memory are there.
        let file = dir.path().join("ledger.db");
        let name = dir.path().file_name().unwrap().to_str().unwrap();
        std::fs::hard_link(&file, out.path().join("hard.db")).expect("hard link");
        std::os::unix::fs::symlink(&file, out.path().join("soft.db")).expect("symlink");
        for into in [
            file.clone(),
            dir.path().join(".").join("ledger.db"),
            dir.path().join("..").join(name).join("ledger.db"),
            out.path().join("hard.db"),
            out.path().join("soft.db"),
            dir.path().join("ledger.db-wal"),
            dir.path().join("ledger.db-shm"),
            dir.path().join("ledger.db-journal"),
        ] {
            assert_refused(&url, &into, ledger_refusal);
        }
        // A relative path from the ledger's folder.
        let relative = opledger_command(
            &url,
            &["replay", "--until", "2", "--into", "ledger.db", "--force"],
        )
        .current_dir(dir.path())
        .output()
        .expect("run opledger");
        assert_eq!(relative.status.code(), Some(2), "{}", stderr(&relative));
        assert!(stderr(&relative).contains(ledger_refusal));
    }

    // Another ledger, and a file no replay made: not even with --force.
    let other = out.path().join("other.db");
    let migrated = opledger(&crate::support::sqlite_url(&other), &["migrate"]);
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    assert_refused_untouched(
        &url,
        &other,
        "holds an opledger ledger: a replay never overwrites a ledger",
    );
    let notes = out.path().join("notes.txt");
    std::fs::write(&notes, "not a replay").expect("write");
    assert_refused_untouched(
        &url,
        &notes,
        "exists and is not a replay: --force replaces only",
    );
    // A ledger where the replay is built first (`<into>.partial`), which a replay would remove.
    let behind = out.path().join("behind.db.partial");
    std::fs::copy(&other, &behind).expect("copy a ledger");
    let output = replay(&url, "2", &out.path().join("behind.db"), &["--force"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("is in the way"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        bytes(&behind),
        bytes(&other),
        "the ledger in the way is kept"
    );

    // An earlier replay is replaced with --force, and a half-built one is cleared away.
    let earlier = out.path().join("earlier.db");
    let built = replay(&url, "2", &earlier, &[]);
    assert!(built.status.success(), "{}", stderr(&built));
    std::fs::copy(&earlier, out.path().join("earlier.db.partial")).expect("copy");
    let again = replay(&url, "3", &earlier, &["--force"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(info(&earlier).await["until_position"], 3);
    assert!(!out.path().join("earlier.db.partial").exists());

    // Every update acknowledged before and after is still in the ledger, and it verifies.
    for update in 6..=10 {
        world.ask(update, 7, &format!("spring{update}")).await;
    }
    let rows = operations(world.app.store.reader()).await;
    assert_eq!(rows.len(), 10);
    world.app.stop().await;
    let verified = opledger(&url, &["audit", "verify"]);
    assert!(verified.status.success(), "{}", stderr(&verified));
    let store = world.ledger.open().await;
    let received = store.read_all(1, 10_000).await.expect("read");
    store.close().await;
    let updates = received
        .iter()
        .filter(|e| e.event_type == "UpdateReceived")
        .count();
    assert_eq!(updates, 10);
}
