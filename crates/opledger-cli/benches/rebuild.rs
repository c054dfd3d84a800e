//! Read-side benchmark: rebuilding projections and verifying the audit chain, against a raw
//! ordered scan of the same events in the same run.
//!
//! For each backend and ledger size it writes a fresh ledger of exactly N events of realistic
//! operation lifecycles (`rebuild/generator.rs`: events decided by the intake's and the
//! worker's own decisions, appended through the store with the inline `operation_status`, as
//! `opledger serve` keeps it), then measures, each
//! in a child process so that its peak RSS is its own:
//!
//! 1. a **raw ordered scan**: every event read in position order with `read_all` pages of the
//!    size a rebuild reads, decoded into `RecordedEvent`s, nothing else (this bench binary run
//!    again in scan mode);
//! 2. `opledger projections rebuild operation_status --json`;
//! 3. `opledger projections rebuild audit_trail --json`;
//! 4. `opledger audit verify --json`.
//!
//! Each command reports its own events/s (its `seconds` field, what the command timed) and peak
//! RSS (`peak_rss_bytes`, its VmHWM); where `/usr/bin/time` exists, the table also shows each
//! process's CPU time and how it compares to the scan's (a measure that other processes on the
//! machine hardly disturb; it does not include the PostgreSQL server's work). The raw scan runs once to warm the caches, then twice
//! right before each command, and each command's rate is divided by the better of those two
//! (the machine is shared: the best of two evens out a scan that another process slowed).
//! Targets (issue 6): rebuild ≥ 0.5× the raw scan, verify ≥ 0.7×, and each command's peak RSS
//! at the largest size ≤ 1.2× its peak RSS at the smallest. The ledger is an SQLite file
//! in a temporary directory or a scratch PostgreSQL database (vacuumed and analyzed after it is
//! written, as autovacuum would), dropped afterwards. A command the binary does not have yet is
//! reported as missing; the benchmark panics if the generator's ledger fails `audit verify` or a
//! command reads another number of events than were written.
//!
//! `cargo bench -p opledger-cli --bench rebuild`
//! (smoke run: `SIZES=20000 BACKENDS=sqlite cargo bench -p opledger-cli --bench rebuild`)
//!
//! Knobs (environment): `SIZES` (events per ledger, comma-separated, default `100000,1000000`),
//! `BACKENDS` (or `OPLEDGER_BENCH_BACKENDS`, default `sqlite,postgres`), `OPLEDGER_BENCH_PG_URL`
//! (default `postgres://postgres@127.0.0.1:5432/postgres`), `OPLEDGER_BENCH_PAGE` (events per
//! page of the raw scan, default the page a rebuild reads), `OPLEDGER_BENCH_ARRIVALS` (updates per
//! simulated second, default 150), `OPLEDGER_BENCH_CALL_EVENTS` (most events per append call of
//! the generator, default 4000), `OPLEDGER_BENCH_SEED` (default 6), `OPLEDGER_BENCH_REPEAT`
//! (runs of each command, each after its two scans; the fastest run counts, and the largest
//! peak RSS; default 1), `OPLEDGER_BENCH_KEEP=1` (leave the ledgers behind, to profile the
//! commands on them by hand; their file or database names are printed).

#[path = "rebuild/generator.rs"]
mod generator;

/// The allocator the `opledger` binary uses, so that the raw scan (this binary, in a child
/// process) and the commands it is compared with allocate alike.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use opledger_store::{AnyOptions, AnyStore, EventStore};
use serde_json::Value;
use sqlx::{ConnectOptions, Connection, Executor};

/// In scan mode (a child process), the ledger to scan.
const SCAN_URL: &str = "OPLEDGER_REBUILD_SCAN_URL";
/// In scan mode, the page size.
const SCAN_PAGE: &str = "OPLEDGER_REBUILD_SCAN_PAGE";
/// The raw scan's page when `OPLEDGER_BENCH_PAGE` is not set: the one a rebuild reads.
fn default_page() -> usize {
    opledger_projections::rebuild::RebuildOptions::default().page_size
}
const REBUILD_TARGET: f64 = 0.5;
const VERIFY_TARGET: f64 = 0.7;
const RSS_TARGET: f64 = 1.2;

fn env_text(names: &[&str], default: &str) -> String {
    names
        .iter()
        .find_map(|name| std::env::var(name).ok())
        .unwrap_or_else(|| default.to_owned())
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// What one measured process reported.
#[derive(Clone, Debug)]
struct Measure {
    events: u64,
    /// What the process timed itself.
    seconds: f64,
    events_per_sec: f64,
    peak_rss_bytes: u64,
    /// The child process from start to exit (opening the ledger, building indexes, ...).
    wall: f64,
    /// The child's CPU time (user + system), when `/usr/bin/time` can tell: unlike events/s,
    /// it hardly changes when other processes share the machine.
    cpu: Option<f64>,
}

impl Measure {
    fn from_json(json: &Value, (wall, cpu): (f64, Option<f64>)) -> Result<Measure, String> {
        let number = |key: &str| {
            json.get(key)
                .and_then(Value::as_f64)
                .ok_or_else(|| format!("its JSON has no number `{key}`: {json}"))
        };
        Ok(Measure {
            events: number("events")? as u64,
            seconds: number("seconds")?,
            events_per_sec: number("events_per_sec")?,
            peak_rss_bytes: number("peak_rss_bytes")? as u64,
            wall,
            cpu,
        })
    }
}

/// One measured thing of a run, with the raw scan that ran just before it.
#[derive(Debug)]
struct Row {
    what: &'static str,
    /// The least acceptable rate as a fraction of the raw scan's (`None`: the scan itself).
    target: Option<f64>,
    result: Result<Measure, String>,
    scan: Option<Measure>,
}

/// Everything measured on one ledger.
#[derive(Debug)]
struct Run {
    backend: &'static str,
    size: u64,
    generated: generator::Generated,
    ledger_bytes: u64,
    rows: Vec<Row>,
}

/// Marks `/usr/bin/time`'s line on a child's stderr.
const TIME_MARK: &str = "opledger-bench-time";

/// A command for `program`, run under `/usr/bin/time` (for its CPU time) where there is one.
fn timed(program: &Path) -> Command {
    let time = Path::new("/usr/bin/time");
    if time.exists() {
        let mut command = Command::new(time);
        command
            .arg("-f")
            .arg(format!("{TIME_MARK} %U %S"))
            .arg("--")
            .arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// Runs a child process (made by [`timed`]) that prints one JSON object on stdout, with its
/// wall and CPU seconds; `Err` says why not.
fn run_json(mut command: Command) -> Result<(Value, (f64, Option<f64>)), String> {
    let started = Instant::now();
    let output = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot start: {e}"))?;
    let wall = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json = stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str::<Value>(line.trim()).ok());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let cpu = stderr.lines().rev().find_map(|line| {
        let mut fields = line.strip_prefix(TIME_MARK)?.split_whitespace();
        let user: f64 = fields.next()?.parse().ok()?;
        let system: f64 = fields.next()?.parse().ok()?;
        Some(user + system)
    });
    match json {
        Some(json) if output.status.success() => Ok((json, (wall, cpu))),
        _ => {
            let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
            Err(format!(
                "{}: stdout `{}`, stderr `{}`",
                output.status,
                stdout.trim(),
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            ))
        }
    }
}

/// The raw ordered scan, in a child process (this binary in scan mode).
fn raw_scan(url: &str, page: usize) -> Measure {
    let exe = std::env::current_exe().expect("the benchmark's own path");
    let mut command = timed(&exe);
    command.env(SCAN_URL, url).env(SCAN_PAGE, page.to_string());
    let (json, exit) = run_json(command).unwrap_or_else(|e| panic!("the raw scan failed: {e}"));
    Measure::from_json(&json, exit).unwrap_or_else(|e| panic!("the raw scan: {e}"))
}

/// Scan mode: reads every event in position order and prints what it took, like the commands.
async fn scan_child(url: &str) {
    let page = env_number(SCAN_PAGE, default_page() as u64).max(1) as usize;
    let store = AnyStore::open(url, AnyOptions::default())
        .await
        .expect("open the ledger to scan");
    let started = Instant::now();
    let (mut from, mut events, mut bytes) = (1, 0u64, 0u64);
    loop {
        let batch = store
            .read_all(from, page)
            .await
            .expect("read a page of events");
        let Some(last) = batch.last() else { break };
        from = last.position + 1;
        events += batch.len() as u64;
        bytes += batch
            .iter()
            .map(|e| (e.payload.len() + e.metadata.len()) as u64)
            .sum::<u64>();
    }
    let seconds = started.elapsed().as_secs_f64();
    store.close().await;
    println!(
        "{}",
        serde_json::json!({
            "events": events,
            "payload_bytes": bytes,
            "seconds": seconds,
            "events_per_sec": events as f64 / seconds,
            "peak_rss_bytes": peak_rss_bytes(),
        })
    );
}

/// This process's peak resident set size (VmHWM), in bytes.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let kib = line.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?;
                kib.trim().parse::<u64>().ok()
            })
        })
        .map_or(0, |kib| kib * 1024)
}

/// The faster of two measures of the same thing, with the larger peak RSS of the two (the
/// memory target is judged on the worst run).
fn best(kept: Option<Measure>, new: Measure) -> Measure {
    match kept {
        None => new,
        Some(kept) => {
            let peak_rss_bytes = kept.peak_rss_bytes.max(new.peak_rss_bytes);
            let faster = if new.events_per_sec > kept.events_per_sec {
                new
            } else {
                kept
            };
            Measure {
                peak_rss_bytes,
                ..faster
            }
        }
    }
}

/// The machine's 1-minute load average, to tell a quiet run from a busy one.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// Whether the `opledger` binary has a subcommand (it may be under construction).
fn has_subcommand(binary: &Path, name: &str) -> bool {
    Command::new(binary)
        .args([name, "--help"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The measured `opledger` commands: label, arguments, target ratio, and the subcommand that
/// must exist.
const COMMANDS: [(&str, &[&str], f64, &str); 3] = [
    (
        "rebuild operation_status",
        &["projections", "rebuild", "operation_status", "--json"],
        REBUILD_TARGET,
        "projections",
    ),
    (
        "rebuild audit_trail",
        &["projections", "rebuild", "audit_trail", "--json"],
        REBUILD_TARGET,
        "projections",
    ),
    (
        "audit verify",
        &["audit", "verify", "--json"],
        VERIFY_TARGET,
        "audit",
    ),
];

/// One `opledger` command on the ledger at `url`.
fn opledger(binary: &Path, url: &str, args: &[&str], size: u64) -> Result<Measure, String> {
    let mut command = timed(binary);
    command
        .arg("--database-url")
        .arg(url)
        .args(args)
        .env("OPLEDGER_LOG", "warn")
        .env_remove("OPLEDGER_CONFIG");
    let (json, exit) = run_json(command)?;
    if json.get("ok").is_some_and(|ok| ok != &Value::Bool(true)) {
        panic!(
            "`opledger {}` found the generated ledger broken: {json}",
            args.join(" ")
        );
    }
    let measure = Measure::from_json(&json, exit)?;
    assert_eq!(
        measure.events,
        size,
        "`opledger {}` read {} events of {size}",
        args.join(" "),
        measure.events
    );
    Ok(measure)
}

/// Writes a ledger of `size` events at `url` and measures everything on it.
async fn run(
    backend: &'static str,
    url: &str,
    size: u64,
    binary: &Path,
    page: usize,
    repeat: u32,
    options: &generator::Options,
) -> Run {
    eprintln!("{backend}, {size} events: generating...");
    let store = AnyStore::open(
        url,
        AnyOptions {
            inline: opledger_projections::inline(),
            ..AnyOptions::default()
        },
    )
    .await
    .expect("open the ledger");
    let generated = generator::generate(
        &store,
        &generator::Options {
            target: size,
            ..options.clone()
        },
    )
    .await;
    store.close().await;
    let ledger_bytes = settle(url).await;
    eprintln!(
        "{backend}, {size} events: generated in {:.1} s ({:.0} events/s, {:.0} MiB); measuring...",
        generated.seconds,
        size as f64 / generated.seconds,
        ledger_bytes as f64 / 1048576.0
    );

    let mut rows = vec![Row {
        what: "raw ordered scan (first, warms caches)",
        target: None,
        result: Ok(raw_scan(url, page)),
        scan: None,
    }];
    for (what, args, target, subcommand) in COMMANDS {
        let mut scan: Option<Measure> = None;
        let mut result = Err(format!("`opledger {subcommand}` does not exist yet"));
        if has_subcommand(binary, subcommand) {
            for _ in 0..repeat {
                // The best of two raw scans right before each run of the command.
                for _ in 0..2 {
                    scan = Some(best(scan, raw_scan(url, page)));
                }
                let measured = opledger(binary, url, args, size);
                result = match (result, measured) {
                    (Ok(kept), Ok(new)) => Ok(best(Some(kept), new)),
                    (_, measured) => measured,
                };
            }
        }
        match &result {
            Ok(m) => eprintln!(
                "  {what}: {:.0} events/s, raw scan just before {:.0} (load {})",
                m.events_per_sec,
                scan.as_ref().map_or(0.0, |s| s.events_per_sec),
                load_average()
            ),
            Err(error) => eprintln!("  {what}: {error}"),
        }
        rows.push(Row {
            what,
            target: Some(target),
            result,
            scan,
        });
    }
    Run {
        backend,
        size,
        generated,
        ledger_bytes,
        rows,
    }
}

/// Brings a freshly written ledger to a steady state (PostgreSQL: vacuumed and analyzed, as
/// autovacuum would; SQLite: the write-ahead log checkpointed) and returns its size in bytes.
async fn settle(url: &str) -> u64 {
    if url.starts_with("postgres") {
        let mut connection = sqlx::PgConnection::connect(url)
            .await
            .expect("connect to the ledger");
        connection
            .execute("VACUUM (ANALYZE)")
            .await
            .expect("vacuum the ledger");
        let size: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
            .fetch_one(&mut connection)
            .await
            .expect("the database's size");
        connection.close().await.ok();
        u64::try_from(size).unwrap_or(0)
    } else {
        let path = url.trim_start_matches("sqlite://");
        let mut connection = sqlx::SqliteConnection::connect(url)
            .await
            .expect("connect to the ledger");
        connection
            .execute("PRAGMA wal_checkpoint(TRUNCATE)")
            .await
            .expect("checkpoint the ledger");
        connection.close().await.ok();
        std::fs::metadata(path).map_or(0, |m| m.len())
    }
}

/// A scratch PostgreSQL database on the server of `admin_url`, dropped with its connections when
/// this value is.
struct Scratch {
    admin: sqlx::postgres::PgConnectOptions,
    name: String,
    url: String,
    /// Left on the server at the end (`OPLEDGER_BENCH_KEEP=1`), to profile commands on it.
    keep: bool,
}

impl Scratch {
    async fn create(admin_url: &str, size: u64, keep: bool) -> Result<Scratch, sqlx::Error> {
        let admin: sqlx::postgres::PgConnectOptions = admin_url.parse()?;
        let name = format!("opledger_rebuild_{}_{size}", std::process::id());
        let mut connection = admin.connect().await?;
        connection
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )))
            .await?;
        connection
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await?;
        connection.close().await?;
        // The admin URL with the scratch database in its path, query string kept.
        let (base, query) = admin_url.split_once('?').unwrap_or((admin_url, ""));
        let server = base
            .rsplit_once('/')
            .filter(|(server, _)| server.contains("//") && !server.ends_with('/'))
            .map_or(base, |(server, _)| server);
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        let url = format!("{server}/{name}{query}");
        Ok(Scratch {
            admin,
            name,
            url,
            keep,
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("kept the PostgreSQL database {}", self.name);
            return;
        }
        let (admin, name) = (self.admin.clone(), self.name.clone());
        // Drop cannot await: the database is dropped from a thread with a runtime of its own.
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(async move {
                    let mut connection = admin.connect().await?;
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    connection.execute(sqlx::AssertSqlSafe(sql)).await?;
                    connection.close().await
                })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop the scratch database {}", self.name);
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

fn print_tables(runs: &[Run], page: usize) {
    println!("\n### Generated ledgers\n");
    println!(
        "| backend | events | updates | operations | append calls | seconds | events/s | ledger MiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for run in runs {
        let g = &run.generated;
        println!(
            "| {} | {} | {} | {} | {} | {:.1} | {:.0} | {:.0} |",
            run.backend,
            run.size,
            g.updates,
            g.operations,
            g.calls,
            g.seconds,
            run.size as f64 / g.seconds,
            mib(run.ledger_bytes)
        );
    }
    if let Some(run) = runs.iter().max_by_key(|r| r.size) {
        let total = run.size as f64;
        let mut mix: Vec<(&&str, &u64)> = run.generated.types.iter().collect();
        mix.sort_by(|a, b| b.1.cmp(a.1));
        let mix: Vec<String> = mix
            .iter()
            .map(|(name, n)| format!("{name} {:.1}%", **n as f64 * 100.0 / total))
            .collect();
        println!("\nEvent mix ({} events): {}", run.size, mix.join(", "));
    }

    // Peak RSS per (backend, measured thing) at the smallest size, for the growth column.
    let smallest: BTreeMap<(&str, &str), (u64, u64)> = runs
        .iter()
        .flat_map(|run| {
            run.rows.iter().filter_map(move |row| {
                let m = row.result.as_ref().ok()?;
                Some(((run.backend, row.what), (run.size, m.peak_rss_bytes)))
            })
        })
        .fold(BTreeMap::new(), |mut acc, (key, value)| {
            let entry = acc.entry(key).or_insert(value);
            if value.0 < entry.0 {
                *entry = value;
            }
            acc
        });

    println!(
        "\n### Read side (raw scan and ratios: each command against the raw scan run just before \
         it; page {page} events)\n"
    );
    println!(
        "| backend | events | measured | events/s | seconds | wall s | CPU s | CPU vs raw scan | \
         raw scan events/s | ratio | rate target | peak RSS MiB | RSS vs smallest size | \
         RSS target |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|");
    let mut misses = Vec::new();
    for run in runs {
        for row in &run.rows {
            let Ok(m) = &row.result else {
                let error = row.result.as_ref().err().map_or("", String::as_str);
                println!(
                    "| {} | {} | {} | n/a ({error}) | | | | | | | | | | |",
                    run.backend, run.size, row.what
                );
                misses.push(format!(
                    "{} {} {}: not measured",
                    run.backend, run.size, row.what
                ));
                continue;
            };
            let (scan, ratio, rate_verdict) = match (&row.scan, row.target) {
                (Some(scan), Some(target)) => {
                    let ratio = m.events_per_sec / scan.events_per_sec;
                    let verdict = if ratio >= target {
                        format!("≥ {target}×: PASS")
                    } else {
                        misses.push(format!(
                            "{} {} {}: {ratio:.2}× the raw scan (target {target}×)",
                            run.backend, run.size, row.what
                        ));
                        format!("≥ {target}×: MISS")
                    };
                    (
                        format!("{:.0}", scan.events_per_sec),
                        format!("{ratio:.2}×"),
                        verdict,
                    )
                }
                _ => (String::new(), String::new(), String::new()),
            };
            let (growth, rss_verdict) = match smallest.get(&(run.backend, row.what)) {
                Some(&(size, rss)) if size < run.size && rss > 0 => {
                    let growth = m.peak_rss_bytes as f64 / rss as f64;
                    let verdict = if growth <= RSS_TARGET {
                        format!("≤ {RSS_TARGET}×: PASS")
                    } else {
                        misses.push(format!(
                            "{} {} {}: peak RSS {growth:.2}× that at {size} events (target \
                             {RSS_TARGET}×)",
                            run.backend, run.size, row.what
                        ));
                        format!("≤ {RSS_TARGET}×: MISS")
                    };
                    (format!("{growth:.2}× ({size})"), verdict)
                }
                _ => (String::new(), String::new()),
            };
            let cpu = m.cpu.map_or(String::new(), |cpu| format!("{cpu:.2}"));
            let cpu_ratio = match (m.cpu, row.scan.as_ref().and_then(|s| s.cpu)) {
                (Some(cpu), Some(scan)) if scan > 0.0 => format!("{:.1}×", cpu / scan),
                _ => String::new(),
            };
            println!(
                "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {cpu} | {cpu_ratio} | {scan} | {ratio} | \
                 {rate_verdict} | {:.1} | {growth} | {rss_verdict} |",
                run.backend,
                run.size,
                row.what,
                m.events_per_sec,
                m.seconds,
                m.wall,
                mib(m.peak_rss_bytes),
            );
        }
    }
    if misses.is_empty() {
        println!("\nEvery target met.");
    } else {
        println!("\nMissed:");
        for miss in misses {
            println!("- {miss}");
        }
    }
}

#[tokio::main]
async fn main() {
    if let Ok(url) = std::env::var(SCAN_URL) {
        scan_child(&url).await;
        return;
    }
    if !std::env::args().any(|a| a == "--bench") {
        println!("run with `cargo bench -p opledger-cli --bench rebuild`");
        return;
    }
    let sizes: Vec<u64> = env_text(&["SIZES"], "100000,1000000")
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.replace('_', "")
                .parse()
                .expect("SIZES is a list of numbers")
        })
        .filter(|n| *n > 0)
        .collect();
    let backends = env_text(&["BACKENDS", "OPLEDGER_BENCH_BACKENDS"], "sqlite,postgres");
    let admin = env_text(
        &["OPLEDGER_BENCH_PG_URL"],
        "postgres://postgres@127.0.0.1:5432/postgres",
    );
    let page = env_number("OPLEDGER_BENCH_PAGE", default_page() as u64).max(1) as usize;
    let options = generator::Options {
        target: 0,
        arrivals: env_number("OPLEDGER_BENCH_ARRIVALS", 150).max(1),
        call_events: env_number("OPLEDGER_BENCH_CALL_EVENTS", 4000).clamp(2, 10_000) as usize,
        seed: env_number("OPLEDGER_BENCH_SEED", 6),
    };
    let repeat = env_number("OPLEDGER_BENCH_REPEAT", 1).clamp(1, 10) as u32;
    let keep = env_number("OPLEDGER_BENCH_KEEP", 0) == 1;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_opledger"));

    let started = Instant::now();
    let mut runs = Vec::new();
    if backends.contains("sqlite") {
        for &size in &sizes {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
            runs.push(run("SQLite", &url, size, &binary, page, repeat, &options).await);
            if keep {
                eprintln!("kept the SQLite ledger {}/ledger.db", dir.keep().display());
            }
        }
    }
    if backends.contains("postgres") {
        for &size in &sizes {
            match Scratch::create(&admin, size, keep).await {
                Ok(database) => {
                    runs.push(
                        run(
                            "PostgreSQL",
                            &database.url,
                            size,
                            &binary,
                            page,
                            repeat,
                            &options,
                        )
                        .await,
                    );
                }
                Err(error) => {
                    println!("PostgreSQL skipped: cannot create a database on the server: {error}");
                    break;
                }
            }
        }
    }
    print_tables(&runs, page);
    println!(
        "\n(whole benchmark: {:.0} s)",
        started.elapsed().as_secs_f64()
    );
}
