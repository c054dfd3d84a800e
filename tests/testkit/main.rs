//! `opledger-testkit`: a child process for the black-box tests, which kill it or run several at
//! once against one ledger. Built only with the `testkit` feature, never shipped.
//!
//! `opledger-testkit append --url URL --callers N --tag T [--calls N] [--hot-streams K]` appends,
//! from N concurrent tasks, calls that each write two streams at once (`pair-T-C-I-a` with one
//! event and `pair-T-C-I-b` with two), so a partial append would show as an `a` without its `b`.
//! With `--hot-streams K`, each task also appends to one of K streams shared by every process
//! (`hot-0` …), at the version it just read, so processes race and losers get typed conflicts.
//! It prints `committed <n>` after every 50 pair calls and, when a call budget is given, a final
//! JSON summary line; any error other than a conflict or `Unavailable` ends it with a failure.
//! It runs until killed when no budget is given. Works on any backend URL.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use opledger_store::{
    AnyOptions, AnyStore, AppendRequest, EventStore, ExpectedVersion, NewEvent, StoreError,
    StreamId,
};

#[derive(Default)]
struct Counts {
    committed: AtomicU64,
    hot_committed: AtomicU64,
    conflicts: AtomicU64,
    unavailable: AtomicU64,
}

impl Counts {
    /// Counts an expected failure; any other error is returned.
    fn failed(&self, error: StoreError) -> Result<(), StoreError> {
        match error {
            StoreError::VersionConflict { .. } => self.conflicts.fetch_add(1, Ordering::SeqCst),
            StoreError::Unavailable { .. } => self.unavailable.fetch_add(1, Ordering::SeqCst),
            other => return Err(other),
        };
        Ok(())
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn event(kind: &str, n: u64) -> NewEvent {
    NewEvent::from_serialize(
        kind,
        1,
        &serde_json::json!({ "n": n }),
        &serde_json::json!({ "causation": { "kind": "system", "component": "testkit" } }),
    )
    .expect("test events serialize")
}

/// The two-stream call number `i` of caller `caller`.
fn pair(tag: &str, caller: u64, i: u64) -> Vec<AppendRequest> {
    let stream =
        |side: &str| StreamId::new(format!("pair-{tag}-{caller}-{i}-{side}")).expect("short id");
    vec![
        AppendRequest::new(stream("a"), ExpectedVersion::NoStream, vec![event("A", i)]),
        AppendRequest::new(
            stream("b"),
            ExpectedVersion::NoStream,
            vec![event("B1", i), event("B2", i)],
        ),
    ]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) != Some("append") {
        return Err(
            "usage: opledger-testkit append --url URL --callers N --tag T [--calls N]".into(),
        );
    }
    let url = arg(&args, "--url").ok_or("--url is required")?;
    let callers: u64 = arg(&args, "--callers").map_or(Ok(4), |v| v.parse())?;
    let tag = arg(&args, "--tag").unwrap_or_else(|| std::process::id().to_string());
    let budget: Option<u64> = arg(&args, "--calls").map(|v| v.parse()).transpose()?;
    let hot: u64 = arg(&args, "--hot-streams").map_or(Ok(0), |v| v.parse())?;

    let store = AnyStore::open(&url, AnyOptions::default()).await?;
    let counts = Arc::new(Counts::default());
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let (store, counts, tag) = (store.clone(), counts.clone(), tag.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while budget.is_none_or(|b| i < b) {
                match store.append(pair(&tag, caller, i)).await {
                    Ok(_) => {
                        let done = counts.committed.fetch_add(1, Ordering::SeqCst) + 1;
                        if done % 50 == 0 {
                            let mut out = std::io::stdout().lock();
                            let _ = writeln!(out, "committed {done}");
                            let _ = out.flush();
                        }
                    }
                    Err(error) => counts.failed(error)?,
                }
                if hot > 0 {
                    let stream = StreamId::new(format!("hot-{}", i % hot)).expect("short id");
                    let version = store.stream_version(&stream).await?;
                    let expected = ExpectedVersion::Exact(version);
                    let request = AppendRequest::new(stream, expected, vec![event("Hot", i)]);
                    match store.append(vec![request]).await {
                        Ok(_) => {
                            counts.hot_committed.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(error) => counts.failed(error)?,
                    }
                }
                i += 1;
            }
            Ok::<(), StoreError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    println!(
        "{}",
        serde_json::json!({
            "committed": counts.committed.load(Ordering::SeqCst),
            "hot_committed": counts.hot_committed.load(Ordering::SeqCst),
            "conflicts": counts.conflicts.load(Ordering::SeqCst),
            "unavailable": counts.unavailable.load(Ordering::SeqCst),
        })
    );
    store.close().await;
    Ok(())
}
