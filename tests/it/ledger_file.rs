//! The SQLite ledger's files under a running `opledger serve` (issue 15 D4, D9, item 3), driven
//! as the real binary:
//! - a disk that fills and frees again: while it is full deliveries get 503; once space is
//!   freed the same process accepts updates again, its projections and worker catch up, and its
//!   write-ahead log is checkpointed and restarted rather than growing until the disk is full
//!   again (it runs on a small tmpfs of its own, so it needs `mount`: root, as in CI);
//! - the ledger file deleted or replaced: no update is acknowledged into a file that is no
//!   longer the ledger, `/readyz` says which file, and after a restart nothing acknowledged is
//!   missing;
//! - the read models' own file (`ledger.read-models.db`, ADR 0014) deleted: the ledger keeps
//!   taking updates, and after a restart the read models are rebuilt in a new file; a read
//!   models' file of another ledger is refused, one that cannot be opened is named at start;
//! - a ledger of the release before that file: its read models are moved into it on start.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::app::{SECRET, TOKEN, message_from};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::serving::{PATIENCE, Serving, ledger_events, opledger, run, write_config};
use crate::support::{sqlite_url, stderr};

/// A configuration with the ledger at `ledger`, one webhook bot whose Bot API is `api`, and an
/// action without an effector (the worker confirms it at once, then replies).
fn config(dir: &Path, ledger: &Path, api: &str) -> PathBuf {
    write_config(
        dir,
        "opledger.toml",
        &format!(
            "[storage]\nurl = \"{url}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
             [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
             webhook_secret_env = \"SHOP_SECRET\"\napi_base_url = \"{api}\"\n\
             [[actions]]\nname = \"coupon\"\nbot = \"shop\"\ncommand = \"coupon\"\n\
             params = [\"campaign\"]\nkey = \"{{campaign}}:{{user_id}}\"\n",
            url = sqlite_url(ledger),
        ),
    )
}

/// `opledger serve` with the configuration at `config`.
fn serve(config: &Path) -> Serving {
    let config = config.to_str().expect("a UTF-8 path");
    Serving::start(opledger(&[
        ("OPLEDGER_CONFIG", config),
        ("SHOP_TOKEN", TOKEN),
        ("SHOP_SECRET", SECRET),
        ("OPLEDGER_TEST_WORKER_MS", "50"),
    ]))
}

/// Update `id`: `/coupon c<id>` from its own user, in its own chat (so replies are not paced).
fn update(id: i64) -> Vec<u8> {
    message_from(id, 1_790_000_000, 10_000 + id, &format!("/coupon c{id}"))
}

/// POSTs update `id` as Telegram does and returns the status (0 when no answer came).
async fn deliver(http: &reqwest::Client, address: SocketAddr, id: i64) -> u16 {
    http.post(format!("http://{address}/telegram/shop/webhook"))
        .header("content-type", "application/json")
        .header("x-telegram-bot-api-secret-token", SECRET)
        .body(update(id))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_or(0, |response| response.status().as_u16())
}

/// `/readyz`: its status and its problems.
async fn readyz(http: &reqwest::Client, address: SocketAddr) -> (u16, Vec<String>) {
    let response = http
        .get(format!("http://{address}/readyz"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("/readyz answers");
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("a JSON body");
    let problems = body["problems"]
        .as_array()
        .expect("a list of problems")
        .iter()
        .map(|p| p.as_str().expect("a sentence").to_owned())
        .collect();
    (status, problems)
}

/// The samples of `/metrics` whose name is `name`, as (labels, value).
async fn samples(http: &reqwest::Client, address: SocketAddr, name: &str) -> Vec<(String, f64)> {
    let text = http
        .get(format!("http://{address}/metrics"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("/metrics answers")
        .text()
        .await
        .expect("a text body");
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let labels = series.strip_prefix(name)?;
            (labels.is_empty() || labels.starts_with('{'))
                .then(|| (labels.to_owned(), value.parse().expect("a number")))
        })
        .collect()
}

/// The update ids the ledger at `ledger` recorded (`UpdateReceived`).
async fn recorded_updates(ledger: &Path) -> BTreeSet<i64> {
    let (events, _) = ledger_events(ledger).await;
    events
        .iter()
        .filter(|event| event["event_type"] == "UpdateReceived")
        .map(|event| {
            event["payload"]["update_id"]
                .as_i64()
                .expect("an update id")
        })
        .collect()
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted when dropped.
struct Tmpfs {
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts it, or returns `None` after saying why on stderr where mounting is impossible
    /// (not root, no `mount`); under CI that is a failure, since CI runs as root.
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mount = dir.path().join("disk");
        std::fs::create_dir(&mount).expect("the mount point");
        let done = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&mount)
            .output();
        let why = match done {
            Ok(output) if output.status.success() => {
                return Some(Tmpfs { mount, _dir: dir });
            }
            Ok(output) => stderr(&output),
            Err(error) => error.to_string(),
        };
        assert!(
            std::env::var_os("CI").is_none(),
            "cannot mount a tmpfs under CI (it runs as root): {why}"
        );
        eprintln!("SKIPPED: cannot mount a tmpfs for the full-disk test (run as root): {why}");
        None
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily, so that a failing test whose process still holds files cannot leave it.
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// Fills the file system holding `path` with one file there, until no byte more fits.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).expect("create the filler");
    let chunk = vec![0u8; 64 * 1024];
    let mut size = chunk.len();
    while size > 0 {
        match file.write(&chunk[..size]) {
            Ok(0) => size /= 2,
            Ok(_) => {}
            Err(error) if error.raw_os_error() == Some(28) => size /= 2, // ENOSPC
            Err(error) => panic!("filling the disk: {error}"),
        }
    }
    let _ = file.sync_all();
}

/// The WAL header's checkpoint sequence and first salt: both change whenever SQLite restarts
/// the log from its beginning (after a complete checkpoint).
fn wal_generation(wal: &Path) -> [u8; 8] {
    let header = std::fs::read(wal).expect("read the WAL");
    header[12..20].try_into().expect("a WAL header")
}

/// Waits until `check` holds, or fails with `what` and the service's log.
async fn eventually<F: std::future::Future<Output = Result<(), String>>>(
    serving: &Serving,
    what: &str,
    patience: Duration,
    check: impl Fn() -> F,
) {
    let deadline = Instant::now() + patience;
    loop {
        let outcome = check().await;
        match outcome {
            Ok(()) => return,
            Err(state) if Instant::now() > deadline => {
                let log = serving.stderr();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                panic!(
                    "{what} within {} s: {state}\nlast lines of the log, newest first:\n{}",
                    patience.as_secs(),
                    tail.join("\n")
                );
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_fills_and_frees_again_is_survived_without_a_restart() {
    // Room for what a healthy ledger may keep: its WAL up to the store's 16 MiB limit, the read
    // models' file and its WAL beside it, and the database files. A smaller disk is filled
    // again by the catch-up burst itself once the filler is gone (24 MiB was, in about a third of
    // runs), and a disk with no room left for the checkpoint to grow the database into cannot
    // recover.
    let Some(disk) = Tmpfs::mount("64m") else {
        return;
    };
    let telegram = FakeTelegram::start(TOKEN).await;
    let config_dir = tempfile::tempdir().expect("temporary directory");
    let ledger = disk.mount.join("ledger.db");
    let wal = disk.mount.join("ledger.db-wal");
    let config = config(config_dir.path(), &ledger, &telegram.base_url());
    let mut serving = serve(&config);
    let address = serving.address().await;
    let http = reqwest::Client::new();
    let mut acknowledged = BTreeSet::new();
    let mut next = 1i64;

    // A working service first.
    for _ in 0..50 {
        assert_eq!(deliver(&http, address, next).await, 200, "update {next}");
        acknowledged.insert(next);
        next += 1;
    }

    // The disk fills up: deliveries are refused (503, never anything else) once the ledger
    // cannot grow, and the projections and the worker, which write too, fail meanwhile.
    let filler = disk.mount.join("filler");
    fill(&filler);
    let mut refused = Vec::new();
    let full_since = Instant::now();
    while refused.len() < 20 || full_since.elapsed() < Duration::from_secs(2) {
        assert!(
            next < 10_000,
            "the ledger kept accepting updates on a full disk"
        );
        match deliver(&http, address, next).await {
            200 => {
                acknowledged.insert(next);
            }
            503 => refused.push(next),
            other => panic!("update {next} on a full disk got {other}, not 200 or 503"),
        }
        next += 1;
    }

    // Space is freed: the same process accepts updates again, Telegram's retries included.
    std::fs::remove_file(&filler).expect("free the disk");
    let first = next;
    next += 1;
    let freed = Instant::now();
    while deliver(&http, address, first).await != 200 {
        assert!(
            freed.elapsed() < PATIENCE,
            "no update accepted {} s after the disk was freed; log: {}",
            PATIENCE.as_secs(),
            serving.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    acknowledged.insert(first);
    for id in refused {
        assert_eq!(
            deliver(&http, address, id).await,
            200,
            "retried update {id}"
        );
        acknowledged.insert(id);
    }
    // A lot more traffic than the log holds: it must be restarted (after checkpoints), not
    // grown for as long as the writes go on (the defect), which passes this bound within the
    // 400 updates. A log the checkpointer restarts peaked at 10.6-14 MiB here after the catch-up
    // burst; under a loaded machine it may restart late, so the bound is not tight.
    let wal_bound = 24 * 1024 * 1024;
    for _ in 0..400 {
        assert_eq!(deliver(&http, address, next).await, 200, "update {next}");
        acknowledged.insert(next);
        next += 1;
        let size = std::fs::metadata(&wal).expect("the WAL").len();
        assert!(
            size < wal_bound,
            "the WAL grew to {size} bytes after the disk was freed"
        );
    }

    // Everything catches up: the projections (lag 0, ready) and the worker (every operation
    // confirmed).
    let operations = acknowledged.len() as f64;
    let client = &http;
    eventually(
        &serving,
        "the projections and the worker did not catch up",
        Duration::from_secs(90),
        move || async move {
            let lags = samples(client, address, "opledger_projection_lag_events").await;
            let states = samples(client, address, "opledger_operations").await;
            let count = |state: &str| {
                states
                    .iter()
                    .find(|(labels, _)| labels.contains(&format!("\"{state}\"")))
                    .map_or(0.0, |(_, n)| *n)
            };
            // Every operation settled. An outcome whose commit failed on the full disk is
            // recorded again once the disk has room (the worker retries it for a minute); if
            // the lease ran out first, the sweep decided on an unknown outcome meanwhile, and
            // the late outcome is kept for the audit trail.
            let settled = count("confirmed") + count("failed");
            let (ready, problems) = readyz(client, address).await;
            if lags.iter().all(|(_, lag)| *lag == 0.0)
                && !lags.is_empty()
                && settled == operations
                && ready == 200
            {
                Ok(())
            } else {
                Err(format!(
                    "lags {lags:?}, operations {states:?} (want {operations} confirmed or failed), \
                     /readyz {ready} {problems:?}"
                ))
            }
        },
    )
    .await;

    // Quiet now: the log is checkpointed completely and restarted by the next write (nothing
    // holds an old snapshot).
    let before = wal_generation(&wal);
    let restarted = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(deliver(&http, address, next).await, 200, "update {next}");
        acknowledged.insert(next);
        next += 1;
        if wal_generation(&wal) != before {
            break;
        }
        assert!(
            restarted.elapsed() < PATIENCE,
            "the WAL was never restarted once the service was quiet"
        );
    }

    // Nothing acknowledged is missing, and no process was restarted to get here.
    assert!(serving.running(), "the same process served throughout");
    assert!(serving.terminate().await.success(), "{}", serving.stderr());
    let recorded = recorded_updates(&ledger).await;
    let missing: Vec<_> = acknowledged.difference(&recorded).collect();
    assert!(missing.is_empty(), "acknowledged but missing: {missing:?}");
}

/// What happens to the ledger's files under the running service.
#[derive(Debug, Clone, Copy)]
enum Loss {
    /// `rm ledger.db*`.
    Deleted,
    /// Only the write-ahead log is deleted: what it holds is gone at the next start.
    WalDeleted,
    /// A copy (a consistent backup) is renamed over the database, its old log and index
    /// removed, as an operator restoring a backup would.
    Replaced,
}

/// Delivers updates, loses the ledger's file as `loss` says, and checks that nothing is
/// acknowledged any more, that `/readyz` names the file, and that after a restart every update
/// acknowledged is in the ledger (the ones acknowledged before the loss only where the loss kept
/// them) and Telegram's retries are recorded.
async fn lost(loss: Loss) {
    let ten = TenServed::start().await;
    let TenServed {
        dir,
        ledger,
        config,
        mut serving,
        address,
        http,
        ..
    } = ten;
    let side = |suffix: &str| dir.path().join(format!("ledger.db{suffix}"));

    let lost_file = match loss {
        Loss::Deleted => {
            for suffix in ["", "-wal", "-shm"] {
                std::fs::remove_file(side(suffix)).expect("delete a ledger file");
            }
            ledger.clone()
        }
        Loss::WalDeleted => {
            std::fs::remove_file(side("-wal")).expect("delete the WAL");
            side("-wal")
        }
        Loss::Replaced => {
            use sqlx::{ConnectOptions, Executor};
            let backup = dir.path().join("backup.db");
            let mut connection = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&ledger)
                .connect()
                .await
                .expect("open the ledger");
            connection
                .execute(sqlx::AssertSqlSafe(format!(
                    "VACUUM INTO '{}'",
                    backup.display()
                )))
                .await
                .expect("back the ledger up");
            drop(connection);
            std::fs::remove_file(side("-wal")).expect("remove the old WAL");
            std::fs::remove_file(side("-shm")).expect("remove the old index");
            std::fs::rename(&backup, &ledger).expect("put the backup in place");
            ledger.clone()
        }
    };

    // Nothing is acknowledged any more, and readiness says which file is gone.
    for id in 11..=30 {
        assert_eq!(
            deliver(&http, address, id).await,
            503,
            "update {id} after the ledger's file was {loss:?}"
        );
    }
    let (status, problems) = readyz(&http, address).await;
    assert_eq!(status, 503, "{problems:?}");
    let named = lost_file.display().to_string();
    assert!(
        problems.iter().any(|p| p.contains(&named)),
        "/readyz names {named}: {problems:?}"
    );
    assert!(serving.terminate().await.success(), "{}", serving.stderr());

    // After a restart Telegram's retries are recorded, and nothing acknowledged is missing.
    let mut serving = serve(&config);
    let address = serving.address().await;
    for id in 11..=30 {
        assert_eq!(
            deliver(&http, address, id).await,
            200,
            "retried update {id}"
        );
    }
    assert!(serving.terminate().await.success(), "{}", serving.stderr());
    let recorded = recorded_updates(&ledger).await;
    let kept: BTreeSet<i64> = match loss {
        // The deleted files took the first updates with them: the operator's loss.
        Loss::Deleted => BTreeSet::new(),
        // What the deleted log held but the database did not, went with it.
        Loss::WalDeleted => recorded.iter().copied().filter(|id| *id <= 10).collect(),
        Loss::Replaced => (1..=10).collect(),
    };
    let expected: BTreeSet<i64> = kept.into_iter().chain(11..=30).collect();
    assert_eq!(
        recorded, expected,
        "the updates in the ledger after {loss:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_file_deleted_under_serve_stops_acknowledgements() {
    lost(Loss::Deleted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_ahead_log_deleted_under_serve_stops_acknowledgements() {
    lost(Loss::WalDeleted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_file_replaced_under_serve_stops_acknowledgements() {
    lost(Loss::Replaced).await;
}

/// The rows of `table` in the SQLite file at `path` (0 when it has no such table), read on a
/// read-only connection.
async fn rows_in(path: &Path, table: &str) -> i64 {
    use sqlx::ConnectOptions;
    let mut connection = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .connect()
        .await
        .expect("open the file");
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = $1)",
    )
    .bind(table)
    .fetch_one(&mut connection)
    .await
    .expect("look the table up");
    if !exists {
        return 0;
    }
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{table}\""
    )))
    .fetch_one(&mut connection)
    .await
    .expect("count the rows")
}

/// Waits until every read model's lag (`/metrics`) is 0.
async fn caught_up(serving: &Serving, http: &reqwest::Client, address: SocketAddr) {
    eventually(
        serving,
        "the read models did not catch up",
        PATIENCE,
        move || async move {
            let lags = samples(http, address, "opledger_projection_lag_events").await;
            if !lags.is_empty() && lags.iter().all(|(_, lag)| *lag == 0.0) {
                Ok(())
            } else {
                Err(format!("lags {lags:?}"))
            }
        },
    )
    .await;
}

/// `opledger serve` on a new ledger in its own folder, ten updates delivered.
struct TenServed {
    _telegram: FakeTelegram,
    dir: tempfile::TempDir,
    ledger: PathBuf,
    read_models: PathBuf,
    config: PathBuf,
    serving: Serving,
    address: SocketAddr,
    http: reqwest::Client,
}

impl TenServed {
    async fn start() -> Self {
        let telegram = FakeTelegram::start(TOKEN).await;
        let dir = tempfile::tempdir().expect("temporary directory");
        let ledger = dir.path().join("ledger.db");
        let read_models = dir.path().join("ledger.read-models.db");
        let config = config(dir.path(), &ledger, &telegram.base_url());
        let mut serving = serve(&config);
        let address = serving.address().await;
        let http = reqwest::Client::new();
        for id in 1..=10 {
            assert_eq!(deliver(&http, address, id).await, 200, "update {id}");
        }
        Self {
            _telegram: telegram,
            dir,
            ledger,
            read_models,
            config,
            serving,
            address,
            http,
        }
    }

    /// Starts the service again (after a stop) and waits until the read models are rebuilt:
    /// one audit row per event of the ledger.
    async fn restart_and_rebuild(&mut self) {
        self.serving = serve(&self.config);
        self.address = self.serving.address().await;
        caught_up(&self.serving, &self.http, self.address).await;
        let (events, _) = ledger_events(&self.ledger).await;
        assert_eq!(
            rows_in(&self.read_models, "audit_trail").await,
            i64::try_from(events.len()).expect("a count"),
            "one audit row per event"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_models_file_deleted_under_serve_leaves_the_ledger_going_and_is_rebuilt() {
    let mut ten = TenServed::start().await;
    caught_up(&ten.serving, &ten.http, ten.address).await;
    let (ledger, read_models, http) = (
        ten.ledger.clone(),
        ten.read_models.clone(),
        ten.http.clone(),
    );
    // The asynchronous read models are in their own file, the inline one in the ledger's.
    let (events, _) = ledger_events(&ledger).await;
    assert!(rows_in(&read_models, "audit_trail").await >= 20);
    assert_eq!(rows_in(&ledger, "audit_trail").await, 0);
    assert_eq!(rows_in(&ledger, "operation_status").await, 10);
    assert!(!events.is_empty());

    // The read models' file goes: the ledger keeps taking updates.
    for suffix in ["", "-wal", "-shm"] {
        let mut path = read_models.as_os_str().to_owned();
        path.push(suffix);
        let _ = std::fs::remove_file(path);
    }
    for id in 11..=20 {
        assert_eq!(deliver(&http, ten.address, id).await, 200, "update {id}");
    }
    // The runner finds the file gone at its next page, which may come after the last answer.
    let serving = &mut ten.serving;
    let said = serving.logged("ledger.read-models.db was deleted").await;
    assert!(
        said.is_ok(),
        "the runner says why it paused: {}",
        serving.stderr()
    );
    assert!(serving.terminate().await.success(), "{}", serving.stderr());

    // After a restart the read models are rebuilt in a new file, every event in them.
    ten.restart_and_rebuild().await;
    assert_eq!(recorded_updates(&ledger).await, (1..=20).collect());
    let serving = &mut ten.serving;
    assert!(serving.terminate().await.success(), "{}", serving.stderr());
}

/// The markers beside the read models' file that say a process writes it unsynced.
fn unsynced_markers(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .expect("list the folder")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| {
            path.file_name().is_some_and(|n| {
                n.to_string_lossy()
                    .starts_with("ledger.read-models.db-unsynced-")
            })
        })
        .collect()
}

/// The read models' file is written unsynced under a marker: a clean stop syncs it and removes
/// the marker; a marker left from another boot (the machine went down while a process wrote
/// the file) makes the next start discard the file and rebuild every read model from the
/// ledger.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_models_file_left_unsynced_by_a_machine_crash_is_rebuilt() {
    let mut ten = TenServed::start().await;
    caught_up(&ten.serving, &ten.http, ten.address).await;
    let (dir, serving) = (ten.dir.path().to_owned(), &mut ten.serving);
    assert_eq!(unsynced_markers(&dir).len(), 1, "one marker while serving");
    assert!(serving.terminate().await.success(), "{}", serving.stderr());
    assert_eq!(
        unsynced_markers(&dir),
        Vec::<PathBuf>::new(),
        "gone at a clean stop"
    );

    // As a process of the boot before would leave it: a marker, and pages that may be torn
    // (here a table no read model has, which a rebuilt file cannot hold).
    std::fs::write(
        dir.join("ledger.read-models.db-unsynced-4242-0"),
        "00000000-0000-0000-0000-000000000000",
    )
    .expect("write the marker");
    {
        use sqlx::ConnectOptions;
        let mut connection = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&ten.read_models)
            .connect()
            .await
            .expect("open the read models' file");
        sqlx::raw_sql("CREATE TABLE torn (x); INSERT INTO torn VALUES (1)")
            .execute(&mut connection)
            .await
            .expect("write the read models' file");
    }

    ten.restart_and_rebuild().await;
    assert_eq!(
        rows_in(&ten.read_models, "torn").await,
        0,
        "the file was discarded"
    );
    let serving = &mut ten.serving;
    let markers = unsynced_markers(&dir);
    assert_eq!(markers.len(), 1, "only this process's marker: {markers:?}");
    assert!(serving.terminate().await.success(), "{}", serving.stderr());
    assert!(
        serving.stderr().contains("discarding it"),
        "the service says why the read models are rebuilt: {}",
        serving.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_models_file_of_another_ledger_is_refused() {
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let http = reqwest::Client::new();
    let mut configs = Vec::new();
    for name in ["one", "two"] {
        let folder = dir.path().join(name);
        std::fs::create_dir(&folder).expect("a folder");
        let config = config(&folder, &folder.join("ledger.db"), &telegram.base_url());
        let mut serving = serve(&config);
        let address = serving.address().await;
        assert_eq!(deliver(&http, address, 1).await, 200);
        assert!(serving.terminate().await.success(), "{}", serving.stderr());
        configs.push((folder, config));
    }
    let (one, _) = &configs[0];
    let (two, config) = &configs[1];
    std::fs::copy(
        one.join("ledger.read-models.db"),
        two.join("ledger.read-models.db"),
    )
    .expect("copy the read models' file");
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(two.join(format!("ledger.read-models.db{suffix}")));
    }
    let mut serving = serve(config);
    let status = serving.exit().await;
    assert!(!status.success());
    let err = serving.stderr();
    assert!(
        err.contains("belongs to another ledger") && err.contains("ledger.read-models.db"),
        "{err}"
    );
    // Nothing was written in it: no marker is left that would discard it after a reboot.
    assert_eq!(
        unsynced_markers(two),
        Vec::<PathBuf>::new(),
        "a refused file keeps no marker"
    );
    // Moved away, the service starts again and rebuilds its read models.
    std::fs::remove_file(two.join("ledger.read-models.db")).expect("remove the copy");
    let mut serving = serve(config);
    let address = serving.address().await;
    caught_up(&serving, &http, address).await;
    assert!(serving.terminate().await.success(), "{}", serving.stderr());
}

/// A read models' file that cannot be opened or written (here a folder stands where the file
/// goes) stops the service at start with a message naming the file and what to do, rather than
/// a bare "cannot reach the database"; the ledger itself is untouched and serves once the path
/// is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_read_models_file_is_named_at_start() {
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let http = reqwest::Client::new();
    let config = config(
        dir.path(),
        &dir.path().join("ledger.db"),
        &telegram.base_url(),
    );
    let mut serving = serve(&config);
    let address = serving.address().await;
    assert_eq!(deliver(&http, address, 1).await, 200);
    assert!(serving.terminate().await.success(), "{}", serving.stderr());
    let read_models = dir.path().join("ledger.read-models.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.path().join(format!("ledger.read-models.db{suffix}")));
    }
    std::fs::create_dir(&read_models).expect("a folder where the file goes");
    let mut serving = serve(&config);
    let status = serving.exit().await;
    assert!(!status.success());
    let err = serving.stderr();
    assert!(
        err.contains("cannot open or write the read models' file")
            && err.contains("ledger.read-models.db"),
        "{err}"
    );
    std::fs::remove_dir(&read_models).expect("remove the folder");
    let mut serving = serve(&config);
    let address = serving.address().await;
    caught_up(&serving, &http, address).await;
    assert_eq!(deliver(&http, address, 1).await, 200, "a duplicate, still");
    assert!(serving.terminate().await.success(), "{}", serving.stderr());
}

/// A ledger written by the release before ADR 0014 (`tests/fixtures/ledgers/`: made by that
/// release's `opledger demo --ledger`, its asynchronous read models in the ledger's own file).
/// This release moves them: it creates the read models' own file, rebuilds every one there with
/// the rows the old release had, drops the old tables from the ledger's file, and the ledger
/// itself is untouched (same events, its chain verifies), still deduplicating old updates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_of_the_release_before_the_read_models_file_is_moved_on_start() {
    const MOVED: [&str; 4] = [
        "audit_trail",
        "reconciliation_queue",
        "user_operations",
        "metrics",
    ];
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let http = reqwest::Client::new();
    let ledger = dir.path().join("ledger.db");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/ledgers/before-read-models-file.db");
    std::fs::copy(&fixture, &ledger).expect("copy the old release's ledger");
    let mut before = Vec::new();
    for table in MOVED {
        before.push(rows_in(&ledger, table).await);
    }
    assert!(
        before.iter().all(|rows| *rows > 0),
        "the fixture holds every moved read model: {before:?}"
    );
    let events_before = ledger_events(&ledger).await;
    let config = config(dir.path(), &ledger, &telegram.base_url());
    let mut serving = serve(&config);
    let address = serving.address().await;
    caught_up(&serving, &http, address).await;
    assert!(serving.terminate().await.success(), "{}", serving.stderr());

    let read_models = dir.path().join("ledger.read-models.db");
    for (table, rows) in MOVED.iter().zip(&before) {
        assert_eq!(
            rows_in(&read_models, table).await,
            *rows,
            "`{table}` rebuilt in the read models' file"
        );
        assert_eq!(
            rows_in(&ledger, table).await,
            0,
            "`{table}` left the ledger's file"
        );
    }
    assert_eq!(
        ledger_events(&ledger).await,
        events_before,
        "the ledger is untouched"
    );
    let mut verify = opledger(&[]);
    verify
        .arg("--database-url")
        .arg(sqlite_url(&ledger))
        .args(["audit", "verify"]);
    let verified = run(verify).await;
    assert!(verified.status.success(), "{}", stderr(&verified));
}
