//! Text a backend cannot store (issue 15, D1), through the real `opledger serve` on both
//! backends: U+0000 in a command's argument, in an effector's success answer, in a Bot API
//! error's description and in an update's top-level key. PostgreSQL refuses U+0000 in `text`,
//! so before the rule of ADR 0010 the first poisoned every retry of its chat with a 503, the
//! second left its operation in `call_sent`, and the last stalled `audit_trail` (and `/readyz`).
//! Now every edge keeps such text as `opledger_domain::text::storable` makes it (U+0000 becomes
//! U+FFFD), identically on both backends: the chat is answered 200 at once, the operation ends,
//! every read model catches up, and the ledger verifies.

use std::time::{Duration, Instant};

use opledger_projections::operation_status;
use opledger_store::{AnyStore, EventStore};
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::app::{Backend, Ledger, SECRET, TOKEN, message_from, on_both_backends};
use crate::support::fake_service::{Behaviour, FakeService};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::serving::{PATIENCE, Serving, opledger, run, write_coupon_config};
use crate::support::{stderr, stdout};

/// What U+0000 becomes in the ledger.
const REPLACED: char = '\u{FFFD}';

on_both_backends!(nul_in_text_from_outside_is_kept_storable_and_nothing_retries_forever);

async fn nul_in_text_from_outside_is_kept_storable_and_nothing_retries_forever(backend: Backend) {
    let started = Instant::now();
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let service = FakeService::start(false).await;
    service.script([Behaviour::Answer {
        status: 201,
        body: r#"{"id":"ext-1\u0000x","code":"SAVE-1"}"#.to_owned(),
    }]);
    let telegram = FakeTelegram::start(TOKEN).await;
    telegram.script_send_message_error(StatusCode::BAD_REQUEST, "Bad Request: chat\u{0}not found");
    let dir = tempfile::tempdir().expect("a directory");
    let config = write_coupon_config(
        dir.path(),
        &ledger,
        &telegram,
        &service,
        "timeout_ms = 2000\n",
    );
    let config = config.as_str();
    let env = [
        ("OPLEDGER_CONFIG", config),
        ("SHOP_TOKEN", TOKEN),
        ("SHOP_SECRET", SECRET),
        ("OPLEDGER_TEST_WORKER_MS", "50"),
    ];
    let mut serving = Serving::start(opledger(&env));
    let address = serving.address().await;
    let http = reqwest::Client::new();
    let deliver = |body: Vec<u8>| {
        http.post(format!("http://{address}/telegram/shop/webhook"))
            .header("content-type", "application/json")
            .header("x-telegram-bot-api-secret-token", SECRET)
            .body(body)
            .send()
    };

    // The first delivery of each is answered 200: Telegram has nothing to retry.
    let command = message_from(1, 1_790_000_000, 7, "/coupon spr\u{0}ing");
    let odd_key = br#"{"update_id":2,"foo\u0000bar":{"x":1}}"#.to_vec();
    for (case, body) in [("the command", command), ("the top-level key", odd_key)] {
        let answer = deliver(body).await.expect("the webhook answers");
        assert_eq!(
            answer.status(),
            StatusCode::OK,
            "{case}: {}",
            serving.stderr()
        );
    }

    // The operation ends, its reply's failure is recorded, and every read model catches up.
    let store = ledger.open().await;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let projections = opledger_projections::registry::list(&store)
            .await
            .expect("the registry");
        let caught_up = projections.iter().all(|p| p.lag == 0);
        let types: Vec<String> = payloads(&store).await.into_iter().map(|(t, _)| t).collect();
        let ended = ["Confirmed", "ReplyFailed"]
            .iter()
            .all(|t| types.iter().any(|seen| seen == t));
        if ended && caught_up {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not settled: {types:?}\n{projections:#?}\nstderr: {}",
            serving.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = http
        .get(format!("http://{address}/readyz"))
        .send()
        .await
        .expect("readyz answers");
    assert_eq!(ready.status(), StatusCode::OK, "{:?}", ready.text().await);

    // What the ledger keeps: the same storable text on both backends.
    let payloads = payloads(&store).await;
    let one = |event_type: &str| -> &Value {
        let found: Vec<&Value> = payloads
            .iter()
            .filter(|(t, _)| t == event_type)
            .map(|(_, p)| p)
            .collect();
        assert_eq!(found.len(), 1, "one {event_type}: {payloads:#?}");
        found[0]
    };
    let received = one("Received");
    assert_eq!(received["business_key"], format!("spr{REPLACED}ing:7"));
    assert_eq!(received["params"]["campaign"], format!("spr{REPLACED}ing"));
    assert_eq!(
        one("Confirmed")["external_id"],
        format!("ext-1{REPLACED}x"),
        "the effect happened: its answer is kept, storable"
    );
    let reason = one("ReplyFailed")["reason"].as_str().expect("a reason");
    assert!(
        reason.contains(&format!("chat{REPLACED}not found")),
        "{reason}"
    );
    let kinds: Vec<&str> = payloads
        .iter()
        .filter(|(t, _)| t == "UpdateReceived")
        .filter_map(|(_, p)| p["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["message", &format!("other:foo{REPLACED}bar")]);
    let sent = service.body(received["operation_id"].as_str().expect("an id"));
    assert_eq!(
        sent.as_ref().map(|b| b["params"]["campaign"].clone()),
        Some(Value::from(format!("spr{REPLACED}ing"))),
        "the effector was asked with the stored parameters: {sent:?}"
    );
    assert_eq!(service.total_requests(), 1, "called once");
    let row = operation_status::get(
        store.reader(),
        received["operation_id"].as_str().expect("an id"),
    )
    .await
    .expect("read operation_status")
    .expect("its row");
    assert_eq!(row.status, "confirmed");
    assert_eq!(row.external_id, Some(format!("ext-1{REPLACED}x")));
    store.close().await;

    let status = serving.terminate().await;
    assert_eq!(status.code(), Some(0), "stderr: {}", serving.stderr());
    let mut verify = opledger(&[]);
    verify
        .arg("--database-url")
        .arg(ledger.url())
        .args(["audit", "verify"]);
    let verified = run(verify).await;
    assert!(
        verified.status.success(),
        "{}{}",
        stdout(&verified),
        stderr(&verified)
    );
    eprintln!("{backend:?}: {:?}", started.elapsed());
}

/// Every event's type and payload, in ledger order.
async fn payloads(store: &AnyStore) -> Vec<(String, Value)> {
    store
        .read_all(1, 100_000)
        .await
        .expect("read the ledger")
        .into_iter()
        .map(|e| {
            let payload = serde_json::from_slice(&e.payload).expect("JSON");
            (e.event_type, payload)
        })
        .collect()
}
