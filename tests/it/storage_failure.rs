//! The database going away under a running service (DESIGN §2 guarantee 1, §11 scenario 9):
//! while PostgreSQL is down no update is acknowledged and nothing is half written; once it is back
//! the service recovers by itself and the same delivery is recorded once.
//!
//! It stops and restarts a PostgreSQL server of its own (`PrivateCluster`), so that the tests
//! sharing the machine's server are not disturbed. Skipped when the server binaries are missing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use opledger_config::Config;
use reqwest::StatusCode;

use crate::support::app::{COUPON, Ledger, SECRET, TOKEN, TestApp, message};
use crate::support::postgres::PrivateCluster;

/// Event types and streams in the ledger, in order.
async fn recorded(app: &TestApp) -> Vec<(String, String)> {
    app.events()
        .await
        .iter()
        .map(|e| (e.event_type.clone(), e.stream_id.to_string()))
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(t, s)| ((*t).to_owned(), (*s).to_owned()))
        .collect()
}

/// The test bot and the coupon action, with a short request timeout: while the database is
/// down, waiting for a connection is cut short by it, and the answer (503) still comes quickly.
/// A PostgreSQL cluster of the test's own, or `None` (skipped) where none can be started.
async fn private_cluster() -> Option<Arc<PrivateCluster>> {
    tokio::task::spawn_blocking(PrivateCluster::start)
        .await
        .expect("the cluster task")
        .map(Arc::new)
}

fn config() -> Config {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nrequest_timeout_ms = 2000\n\
         [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
         webhook_secret_env = \"SHOP_SECRET\"\n{COUPON}"
    );
    let env: HashMap<&str, &str> = HashMap::from([("SHOP_TOKEN", TOKEN), ("SHOP_SECRET", SECRET)]);
    Config::parse(&text, &|name| env.get(name).map(|v| (*v).to_owned())).expect("test config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_database_gets_503_and_the_service_recovers_when_it_returns() {
    let Some(cluster) = private_cluster().await else {
        return;
    };
    let ledger = Ledger::Url(cluster.url());
    let app = TestApp::spawn(&ledger, &config()).await;
    let stored = message(1, 1_790_000_000, "/coupon spring");
    assert_eq!(app.deliver(stored.clone()).await.status(), StatusCode::OK);

    let stop = cluster.clone();
    tokio::task::spawn_blocking(move || stop.stop())
        .await
        .expect("stop PostgreSQL");
    // Three deliveries that fail at different places: a plain message at its append, a command
    // while reading its operation, and a repeat of a stored update, which cannot be judged
    // without the ledger. None may be acknowledged, none may be guessed.
    let plain = message(2, 1_790_000_010, "hello");
    let command = message(3, 1_790_000_020, "/coupon autumn");
    for (what, body) in [
        ("plain", &plain),
        ("command", &command),
        ("repeat", &stored),
    ] {
        let started = Instant::now();
        let response = app.deliver(body.clone()).await;
        assert_eq!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "{what}: no 2xx for an update that could not be stored"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: answered in time, not after Telegram gave up: {:?}",
            started.elapsed()
        );
    }

    let start = cluster.clone();
    tokio::task::spawn_blocking(move || start.start_server())
        .await
        .expect("start PostgreSQL");
    assert_eq!(
        recorded(&app).await,
        pairs(&[
            ("UpdateReceived", "update-shop-1"),
            ("Received", "op-coupon-spring:42"),
        ]),
        "nothing of the refused deliveries was written"
    );

    // Telegram delivers the same updates again; the service is back without a restart.
    assert_eq!(app.deliver(plain.clone()).await.status(), StatusCode::OK);
    assert_eq!(app.deliver(command.clone()).await.status(), StatusCode::OK);
    assert_eq!(app.deliver(stored).await.status(), StatusCode::OK);
    assert_eq!(
        recorded(&app).await,
        pairs(&[
            ("UpdateReceived", "update-shop-1"),
            ("Received", "op-coupon-spring:42"),
            ("UpdateReceived", "update-shop-2"),
            ("UpdateReceived", "update-shop-3"),
            ("Received", "op-coupon-autumn:42"),
            ("DuplicateDeliveryObserved", "update-shop-1"),
        ]),
        "each recorded once, the repeat judged a duplicate"
    );
    // And once more: still recorded once.
    assert_eq!(app.deliver(command).await.status(), StatusCode::OK);
    assert_eq!(app.count("UpdateReceived").await, 3);
    assert_eq!(app.count("Received").await, 2);
    assert_eq!(app.count("DuplicateDeliveryObserved").await, 2);
    app.stop().await;
}

/// A writer connection that sat idle through a database restart is dead; the first delivery
/// after the restart must not pay for it with a 503: the store retries a batch that failed at
/// its first statement once, on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_first_delivery_after_a_restart_is_recorded_although_the_writer_sat_idle() {
    let Some(cluster) = private_cluster().await else {
        return;
    };
    let ledger = Ledger::Url(cluster.url());
    let app = TestApp::spawn(&ledger, &config()).await;
    assert_eq!(
        app.deliver(message(1, 1_790_000_000, "hello"))
            .await
            .status(),
        StatusCode::OK
    );
    let restart = cluster.clone();
    tokio::task::spawn_blocking(move || {
        restart.stop();
        restart.start_server();
    })
    .await
    .expect("restart PostgreSQL");
    assert_eq!(
        app.deliver(message(2, 1_790_000_010, "/coupon spring"))
            .await
            .status(),
        StatusCode::OK,
        "the first delivery after the restart is recorded, not refused"
    );
    assert_eq!(app.count("UpdateReceived").await, 2);
    assert_eq!(app.count("Received").await, 1);
    app.stop().await;
}
