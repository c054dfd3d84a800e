//! Crash tests with the real binary (issue 5 §7, DESIGN §11 scenario 5): `opledger serve` built
//! with crash points aborts (SIGABRT, as abrupt as `kill -9`) after the intake commit and before
//! the 200; after `Claimed`; after `ExternalCallSent` and before the request; after the service
//! answered and before `Confirmed`; after `ReplyStarted` and before `sendMessage`. A second
//! process on the same ledger then finishes the work, and the fake service's counts per
//! `Idempotency-Key` prove that nothing was lost and no effect doubled: a service that does not
//! honour keys gets at most one request per operation, the ambiguous case ends in
//! reconciliation (or is confirmed by lookup), and a service that honours keys creates once.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use opledger_projections::operation_status::{self, Filter, OperationStatusRow};
use opledger_store::EventStore;

use crate::support::app::{Backend, Ledger, SECRET, TOKEN, message_from};
use crate::support::fake_service::FakeService;
use crate::support::fake_telegram::FakeTelegram;
use crate::support::serving::{PATIENCE, Serving, deliver, opledger, write_coupon_config};

/// What the fake service offers for resolving an unknown outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    /// Neither honours the key nor has a lookup.
    Plain,
    /// Has a lookup by operation id.
    Lookup,
    /// Honours `Idempotency-Key`.
    Honours,
}

/// How the operation must end after the crash and the restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Expect {
    status: &'static str,
    requests: usize,
    creations: usize,
}

const SIGABRT: i32 = 6;

/// Runs one crash: serve with `point` armed, deliver one `/coupon`, see the process abort,
/// restart without crash points, and wait for the operation to settle.
async fn crash(backend: Backend, point: &str, service_kind: Service, expect: Expect) {
    let Some(rig) = Rig::new(backend, service_kind).await else {
        return;
    };
    let Rig {
        ledger, service, ..
    } = &rig;
    let failpoint = format!("{point}=return");
    let env = rig.env(None);
    let armed_env = rig.env(Some(&failpoint));

    let update = message_from(1, 1_790_000_000, 7, "/coupon spring");
    let mut first = Serving::start(opledger(&armed_env));
    let address = first.address().await;
    let answer = deliver(address, &update).await;
    let status = first.exit().await;
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "the process aborted at {point}: {status}; stderr: {}",
        first.stderr()
    );
    if point == "intake-after-commit" {
        assert!(
            answer.is_none(),
            "no answer left the process before it died"
        );
    } else {
        assert_eq!(answer, Some(200));
    }

    let mut second = Serving::start(opledger(&env));
    let address = second.address().await;
    // Telegram delivers an unanswered update again.
    if answer.is_none() {
        assert_eq!(deliver(address, &update).await, Some(200));
    }
    let store = ledger.open().await;
    let row = settle(&store, &second).await;
    assert_eq!(
        row.status, expect.status,
        "after a crash at {point} with a {service_kind:?} service: {row:#?}"
    );
    let key = row.operation_id.clone();
    let requests = service.requests().get(&key).copied().unwrap_or(0);
    let creations = service.creations().get(&key).copied().unwrap_or(0);
    assert_eq!(
        (requests, creations),
        (expect.requests, expect.creations),
        "requests and creations after a crash at {point} with a {service_kind:?} service"
    );
    assert_eq!(service.total_requests(), requests, "no other key was used");
    let events = store.read_all(1, 10_000).await.expect("read the ledger");
    let count = |t: &str| events.iter().filter(|e| e.event_type == t).count();
    assert_eq!(count("UpdateReceived"), 1, "one delivery record");
    assert_eq!(count("Received"), 1, "one operation");
    store.close().await;
    second.terminate().await;
}

/// A ledger, a fake service and a fake Bot API, and the configuration file of a `serve` that
/// uses them.
struct Rig {
    ledger: Ledger,
    service: FakeService,
    telegram: FakeTelegram,
    _dir: tempfile::TempDir,
    config: String,
}

impl Rig {
    async fn new(backend: Backend, kind: Service) -> Option<Rig> {
        let ledger = Ledger::create(backend).await?;
        let service = FakeService::start(kind == Service::Honours).await;
        let telegram = FakeTelegram::start(TOKEN).await;
        let dir = tempfile::tempdir().expect("a directory");
        let lookup = match kind {
            Service::Lookup => format!("lookup_url = \"{}\"\n", service.lookup_url()),
            _ => String::new(),
        };
        let keys = format!(
            "timeout_ms = 300\nhonours_idempotency_key = {}\n{lookup}",
            kind == Service::Honours
        );
        let config = write_coupon_config(dir.path(), &ledger, &telegram, &service, &keys);
        Some(Rig {
            ledger,
            service,
            telegram,
            _dir: dir,
            config,
        })
    }

    /// The environment of `serve`, with `failpoints` armed when given.
    fn env<'a>(&'a self, failpoints: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
        let mut env = vec![
            ("OPLEDGER_CONFIG", self.config.as_str()),
            ("SHOP_TOKEN", TOKEN),
            ("SHOP_SECRET", SECRET),
            ("OPLEDGER_TEST_WORKER_MS", "50"),
        ];
        if let Some(failpoints) = failpoints {
            env.push(("FAILPOINTS", failpoints));
        }
        env
    }
}

/// Waits until the one operation reaches a state no worker moves on its own.
async fn settle(store: &opledger_store::AnyStore, serving: &Serving) -> OperationStatusRow {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let rows = operation_status::list(
            store.reader(),
            &Filter {
                limit: 10,
                ..Filter::default()
            },
        )
        .await
        .expect("read operation_status");
        if let [row] = rows.as_slice()
            && matches!(
                row.status.as_str(),
                "confirmed" | "failed" | "needs_reconciliation"
            )
        {
            return row.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the operation did not settle: {rows:#?}\nstderr: {}",
            serving.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const CONFIRMED_ONCE: Expect = Expect {
    status: "confirmed",
    requests: 1,
    creations: 1,
};

macro_rules! crash_tests {
    ($($name:ident: $point:literal, $service:ident => $expect:expr;)*) => {
        $(
            mod $name {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn sqlite() {
                    crash(Backend::Sqlite, $point, Service::$service, $expect).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() {
                    crash(Backend::Postgres, $point, Service::$service, $expect).await;
                }
            }
        )*
    };
}

crash_tests! {
    after_the_intake_commit_before_the_answer: "intake-after-commit", Plain => CONFIRMED_ONCE;
    after_claimed: "worker-after-claimed", Plain => CONFIRMED_ONCE;
    after_call_sent_plain_service_goes_to_a_person: "worker-after-call-sent", Plain =>
        Expect { status: "needs_reconciliation", requests: 0, creations: 0 };
    after_call_sent_lookup_finds_nothing_and_retries: "worker-after-call-sent", Lookup =>
        CONFIRMED_ONCE;
    after_call_sent_honoured_key_retries: "worker-after-call-sent", Honours => CONFIRMED_ONCE;
    after_the_answer_plain_service_goes_to_a_person: "worker-after-response", Plain =>
        Expect { status: "needs_reconciliation", requests: 1, creations: 1 };
    after_the_answer_lookup_confirms: "worker-after-response", Lookup => CONFIRMED_ONCE;
    after_the_answer_honoured_key_creates_once: "worker-after-response", Honours =>
        Expect { status: "confirmed", requests: 2, creations: 1 };
}

/// A crash between `ReplyStarted` and `sendMessage`: the reply may or may not have left, so
/// the restarted worker records its outcome as unknown and never sends it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_reply_started_the_reply_is_never_sent_twice() {
    reply_crash(Backend::Sqlite).await;
}

async fn reply_crash(backend: Backend) {
    let Some(rig) = Rig::new(backend, Service::Plain).await else {
        return;
    };
    let Rig {
        ledger,
        service,
        telegram,
        ..
    } = &rig;
    let env = rig.env(None);
    let armed_env = rig.env(Some("worker-after-reply-started=return"));
    let mut first = Serving::start(opledger(&armed_env));
    let address = first.address().await;
    let update = message_from(1, 1_790_000_000, 7, "/coupon spring");
    assert_eq!(deliver(address, &update).await, Some(200));
    let status = first.exit().await;
    assert_eq!(status.signal(), Some(SIGABRT), "{}", first.stderr());

    let store = ledger.open().await;
    let row = settle(&store, &first).await;
    assert_eq!(
        (row.status.as_str(), row.reply.as_str()),
        ("confirmed", "in_flight")
    );
    let mut second = Serving::start(opledger(&env));
    second.address().await;
    // The reply's lease is a minute; the restarted worker sees it in flight and leaves it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let row = settle(&store, &second).await;
    assert_eq!(row.reply, "in_flight");
    assert!(
        telegram.calls("sendMessage").is_empty(),
        "a reply in flight is never sent again by another worker"
    );
    store.close().await;
    second.terminate().await;
    assert_eq!(service.total_requests(), 1);
}
