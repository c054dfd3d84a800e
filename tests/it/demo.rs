//! `opledger demo`, run as a newcomer runs it: the real binary, no configuration, no Telegram.
//! It must exit 0 having reported each part of the story, and what it reported must be what
//! its ledger holds, read back afterwards with the ordinary read commands.

use std::process::Command;
use std::time::Instant;

use serde_json::Value;

use crate::support::serving::{PATIENCE, opledger, run};
use crate::support::{sqlite_url, stderr, stdout};

/// `opledger demo` in an empty working directory, with `TMPDIR` in another.
fn demo(cwd: &std::path::Path, tmp: &std::path::Path, args: &[&str]) -> Command {
    let mut command = opledger(&[]);
    command
        .current_dir(cwd)
        .env("TMPDIR", tmp)
        .arg("demo")
        .args(args);
    command
}

/// JSON Lines of a read command on the kept ledger.
async fn json_lines(ledger: &std::path::Path, args: &[&str]) -> Vec<Value> {
    let mut command = opledger(&[]);
    command
        .arg("--database-url")
        .arg(sqlite_url(ledger))
        .args(args);
    let output = run(command).await;
    assert!(output.status.success(), "{args:?}: {}", stderr(&output));
    stdout(&output)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

#[tokio::test]
async fn the_demo_tells_what_its_ledger_holds_and_exits_0() {
    let (cwd, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ledger = cwd.path().join("demo.db");
    let started = Instant::now();
    let output = run(demo(cwd.path(), tmp.path(), &["--ledger", "demo.db"])).await;
    let elapsed = started.elapsed();
    let out = stdout(&output);
    assert!(
        output.status.success(),
        "stdout: {out}\nstderr: {}",
        stderr(&output)
    );
    assert!(elapsed < PATIENCE, "the demo took {elapsed:?}");
    for claim in [
        "✓ the shop issued 1 coupon for spring:42: SPRING-0001 (cpn_1), and the operation is confirmed",
        "✓ the bot replied to Ana once: \"Your spring coupon: SPRING-0001\"",
        "✓ the ledger noted DuplicateDeliveryObserved (update-shop-1001@2",
        "still 1 operation, and the shop still counts 1 coupon for it",
        "✓ 1 operation from 2 clicks",
        "was refused (already_consumed)",
        "✓ the shop issued 1 coupon for autumn:42",
        "(flash:42) needs reconciliation: ",
        "✓ it is the one operation in the reconciliation queue",
        "| coupon flash:42: checking with the shop",
        "$ opledger audit verify\nok: ",
        "In short: 6 deliveries, 3 operations, 3 coupons issued by the shop, never two for one \
         operation; 2 confirmed, 1 waiting for a person;",
        "Explore further: the ledger is kept at demo.db.",
    ] {
        assert!(out.contains(claim), "`{claim}` missing from:\n{out}");
    }
    assert!(!out.contains('✗'), "{out}");

    // What the demo said, read back from the ledger it kept.
    let events = json_lines(&ledger, &["events", "--json"]).await;
    let count = |event_type: &str| {
        events
            .iter()
            .filter(|e| e["event_type"] == event_type)
            .count()
    };
    assert_eq!(count("UpdateReceived"), 5, "five distinct updates");
    assert_eq!(count("DuplicateDeliveryObserved"), 1);
    assert_eq!(count("TokenIssued"), 1);
    assert_eq!(count("TokenConsumed"), 1);
    assert_eq!(count("TokenRejected"), 1);
    assert_eq!(count("Received"), 3, "three operations");
    assert_eq!(
        count("ExternalCallSent"),
        3,
        "one call each, never repeated"
    );
    assert_eq!(count("Confirmed"), 2);
    assert_eq!(count("MarkedForReconciliation"), 1);
    assert_eq!(count("ReplySent"), 2);
    let waiting = json_lines(&ledger, &["reconcile", "list", "--json"]).await;
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(waiting[0]["business_key"], "flash:42");
    let id = waiting[0]["operation_id"].as_str().unwrap();
    assert!(
        out.contains(&format!(
            "reconcile resolve {id} --outcome succeeded --external-id cpn_3"
        )),
        "{out}"
    );
    // The demo's temporary folder is not used when the ledger is kept.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn the_demo_removes_its_temporary_ledger() {
    let (cwd, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let output = run(demo(cwd.path(), tmp.path(), &[])).await;
    let out = stdout(&output);
    assert!(output.status.success(), "{out}\n{}", stderr(&output));
    assert!(
        out.contains("(temporary; keep one with --ledger PATH)"),
        "{out}"
    );
    assert!(
        out.contains("this ledger was temporary and is removed now"),
        "{out}"
    );
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "removed");
    assert_eq!(
        std::fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "nothing written here"
    );
}

#[tokio::test]
async fn the_demo_refuses_a_ledger_that_exists() {
    let (cwd, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(cwd.path().join("mine.db"), b"not yours").unwrap();
    let output = run(demo(cwd.path(), tmp.path(), &["--ledger", "mine.db"])).await;
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let err = stderr(&output);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: mine.db already exists; the demo writes a fresh ledger"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(cwd.path().join("mine.db")).unwrap(),
        b"not yours"
    );
}
