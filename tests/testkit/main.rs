//! `opledger-testkit`: a child process for the black-box tests, which kill it or run several at
//! once against one ledger. Built only with the `testkit` feature, never shipped.
//!
//! `opledger-testkit append --url URL --callers N --tag T [--calls N]` appends, from N concurrent
//! tasks, calls that each write two streams at once (`pair-T-C-I-a` with one event and
//! `pair-T-C-I-b` with two), so a partial append would show as an `a` without its `b`. It prints
//! `committed <n>` after every 50 calls and, when a call budget is given, a final JSON summary
//! line. It runs until killed when no budget is given.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use opledger_store::{
    AppendRequest, EventStore, ExpectedVersion, NewEvent, SqliteOptions, SqliteStore, StoreError,
    StreamId,
};

#[derive(Default)]
struct Counts {
    committed: AtomicU64,
    conflicts: AtomicU64,
    unavailable: AtomicU64,
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

    let store = SqliteStore::open(&url, SqliteOptions::default()).await?;
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
                    Err(StoreError::VersionConflict { .. }) => {
                        counts.conflicts.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(StoreError::Unavailable { .. }) => {
                        counts.unavailable.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(other) => return Err(other),
                }
                i += 1;
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    println!(
        "{}",
        serde_json::json!({
            "committed": counts.committed.load(Ordering::SeqCst),
            "conflicts": counts.conflicts.load(Ordering::SeqCst),
            "unavailable": counts.unavailable.load(Ordering::SeqCst),
        })
    );
    store.close().await;
    Ok(())
}
