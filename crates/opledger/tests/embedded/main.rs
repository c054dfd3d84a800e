//! The embedding crate as a bot uses it, on a real SQLite file and a real PostgreSQL database:
//! declarations checked like the TOML, an update recorded once and handed over until the
//! handlers are done, an action carried out once per business key by an in-process effect,
//! and the webhook served from the bot's own router.

mod postgres;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use opledger::{
    Action, Bot, CallOutcome, Error, Opledger, Recorded, Submit, Success, Updates, effect_fn,
};
use tower::ServiceExt;

const SECRET: &str = "embedded-webhook-secret";

fn bot() -> Bot {
    Bot::webhook("shop", "123456:embedded-token", SECRET)
        .api_base_url("http://127.0.0.1:9")
        .handlers(Updates::All)
        .handler_timeout(Duration::from_secs(2))
}

fn coupon() -> Action {
    Action::new("coupon", "shop")
        .params(["campaign"])
        .key("{user_id}:{campaign}")
}

fn update(update_id: i64, text: &str) -> Vec<u8> {
    serde_json::json!({
        "update_id": update_id,
        "message": {
            "message_id": update_id, "date": 1_700_000_000,
            "chat": {"id": 42, "type": "private"},
            "from": {"id": 42, "is_bot": false, "first_name": "Ann"},
            "text": text
        }
    })
    .to_string()
    .into_bytes()
}

/// An effect that counts its calls and issues `C-<operation id>`.
fn counted(calls: &Arc<AtomicUsize>) -> impl opledger::Effector + 'static {
    let calls = Arc::clone(calls);
    effect_fn(move |request| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            CallOutcome::Succeeded(Success {
                external_id: Some(format!("C-{}", request.operation_id)),
                ..Success::default()
            })
        }
    })
    .honours_idempotency_key()
}

/// The ledgers the tests run on: a SQLite file, and PostgreSQL when it is reachable.
async fn each_backend<F, Fut>(test: F)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    test(format!("sqlite://{}", dir.path().join("bot.db").display())).await;
    if let Some(database) = postgres::Database::create().await {
        test(database.url.clone()).await;
        database.drop().await;
    }
}

#[tokio::test]
async fn a_declaration_is_refused_with_the_message_the_toml_gets() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bot.db").display());
    let in_code = Opledger::builder()
        .ledger(&url)
        .bot(bot())
        .action(Action::new("coupon", "shop").params(["campaign"]))
        .open()
        .await
        .expect_err("an action needs a key")
        .to_string();
    let toml = "[[bots]]\nname = \"shop\"\ntoken_env = \"T\"\nwebhook_secret_env = \"S\"\n\
                [[actions]]\nname = \"coupon\"\nbot = \"shop\"\nparams = [\"campaign\"]\n";
    let in_toml = Opledger::builder()
        .ledger(&url)
        .toml(toml, |name| match name {
            "T" => Some("123456:embedded-token".to_owned()),
            "S" => Some(SECRET.to_owned()),
            _ => None,
        })
        .unwrap()
        .open()
        .await
        .expect_err("the same in TOML")
        .to_string();
    assert_eq!(in_code, in_toml);
    assert!(
        in_code.starts_with("config key `actions[0].key`: is required"),
        "{in_code}"
    );

    let unknown = Opledger::builder()
        .ledger(&url)
        .bot(bot())
        .effector("refund", counted(&Arc::default()))
        .open()
        .await
        .expect_err("no such action");
    assert!(
        matches!(unknown, Error::UnknownAction(ref name) if name == "refund"),
        "{unknown}"
    );
    let both = Opledger::builder()
        .ledger(&url)
        .bot(bot())
        .action(coupon().calls("http://127.0.0.1:9/coupons"))
        .effector("coupon", counted(&Arc::default()))
        .open()
        .await
        .expect_err("an HTTP call and an in-process effect")
        .to_string();
    assert!(
        both.starts_with(
            "config key `actions[0].effector.url`: cannot be combined with in_process"
        ),
        "{both}"
    );
    let message = Opledger::builder()
        .ledger(&url)
        .bot(Bot::webhook(
            "shop",
            "123456:embedded-token",
            "not a secret!",
        ))
        .open()
        .await
        .expect_err("a bad secret")
        .to_string();
    assert!(message.contains("webhook_secret_env"), "{message}");
    assert!(
        !message.contains("not a secret!"),
        "never the secret: {message}"
    );
}

#[tokio::test]
async fn an_update_is_recorded_once_and_handed_over_until_the_handlers_are_done() {
    each_backend(|url| async move {
        let ledger = Opledger::builder()
            .ledger(&url)
            .bot(bot())
            .lease_margin(Duration::from_millis(200))
            .open()
            .await
            .unwrap();
        let mut handed = ledger.handlers("shop").unwrap();
        let running = ledger.start().await.unwrap();
        let body = update(1, "hello");
        let first = ledger.record("shop", &body).await.unwrap();
        assert!(
            matches!(first, Recorded::Accepted { update_id: 1, .. }),
            "{first:?}"
        );
        let again = ledger.record("shop", &body).await.unwrap();
        assert_eq!(again, Recorded::Duplicate { update_id: 1 });

        let one = next(&mut handed).await.expect("handed over");
        assert_eq!((one.update_id(), one.attempt()), (1, 1));
        assert_eq!(one.body(), body.as_slice(), "the exact bytes");
        drop(one);
        let two = next(&mut handed).await.expect("handed over again");
        assert_eq!((two.update_id(), two.attempt()), (1, 2));
        two.fail("not now");
        let three = next(&mut handed).await.expect("and again");
        assert_eq!(three.attempt(), 3);
        three.done();
        assert!(
            tokio::time::timeout(Duration::from_secs(3), handed.next())
                .await
                .is_err(),
            "done: never handed over again, the duplicate neither"
        );
        running.shutdown().await;
    })
    .await;
}

async fn next(updates: &mut opledger::HandedUpdates) -> Option<opledger::Handed> {
    tokio::time::timeout(Duration::from_secs(10), updates.next())
        .await
        .expect("an update within 10 s")
}

#[tokio::test]
async fn an_action_is_carried_out_once_per_business_key() {
    each_backend(|url| async move {
        let calls = Arc::new(AtomicUsize::new(0));
        let ledger = Opledger::builder()
            .ledger(&url)
            .bot(bot())
            .action(coupon())
            .effector("coupon", counted(&calls))
            .action(
                Action::new("welcome", "shop")
                    .params(["campaign"])
                    .key("{user_id}"),
            )
            .effector("welcome", counted(&calls))
            .open()
            .await
            .unwrap();
        let running = ledger.start().await.unwrap();
        let submit = || {
            Submit::new("shop", "coupon")
                .param("campaign", "spring")
                .user(42)
        };
        let wait = Duration::from_secs(20);
        let (first, second) = tokio::join!(ledger.run(submit(), wait), ledger.run(submit(), wait));
        let (first, second) = (first.unwrap(), second.unwrap());
        assert!(
            first.is_confirmed() && second.is_confirmed(),
            "{first:?} {second:?}"
        );
        assert_eq!(
            usize::from(first.started) + usize::from(second.started),
            1,
            "one started it, the other joined"
        );
        assert_eq!(first.operation.operation_id, second.operation.operation_id);
        let third = ledger.run(submit(), wait).await.unwrap();
        assert!(!third.started);
        assert_eq!(
            third.operation.external_id,
            Some(format!("C-{}", third.operation.operation_id))
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the effect ran once");
        let mine = ledger.operations_of("shop", 42, 10).await.unwrap();
        assert_eq!(mine.len(), 1);
        let other = ledger
            .run(
                Submit::new("shop", "coupon")
                    .param("campaign", "autumn")
                    .user(42),
                wait,
            )
            .await
            .unwrap();
        assert!(other.started && other.is_confirmed());
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "another key, another effect"
        );
        assert!(!other.conflict && !third.conflict);
        let welcome = |campaign: &str| {
            Submit::new("shop", "welcome")
                .param("campaign", campaign)
                .user(42)
        };
        let first_welcome = ledger.run(welcome("spring"), wait).await.unwrap();
        let conflicting = ledger.run(welcome("autumn"), wait).await.unwrap();
        assert!(first_welcome.started && !first_welcome.conflict);
        assert!(
            conflicting.conflict && !conflicting.started,
            "{conflicting:?}"
        );
        assert_eq!(
            conflicting.operation.operation_id,
            first_welcome.operation.operation_id
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "one welcome, whatever the campaign"
        );
        let refused = ledger
            .submit(Submit::new("shop", "coupon").user(42))
            .await
            .expect_err("a missing parameter");
        assert!(refused.to_string().contains("campaign"), "{refused}");
        running.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn the_bot_s_router_serves_the_webhook_and_answers_only_after_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let toml = "[[bots]]\nname = \"shop\"\ntoken_env = \"T\"\nwebhook_secret_env = \"S\"\n\
                api_base_url = \"http://127.0.0.1:9\"\n[bots.forward]\nin_process = true\n";
    let calls = Arc::new(AtomicUsize::new(0));
    let ledger = Opledger::builder()
        .ledger(format!("sqlite://{}", dir.path().join("bot.db").display()))
        .toml(toml, |name| match name {
            "T" => Some("123456:embedded-token".to_owned()),
            "S" => Some(SECRET.to_owned()),
            _ => None,
        })
        .unwrap()
        .action(coupon().command("coupon"))
        .effector("coupon", counted(&calls))
        .open()
        .await
        .unwrap();
    let mut handed = ledger.handlers("shop").unwrap();
    let running = ledger.start().await.unwrap();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "the bot's own page" }))
        .merge(ledger.router());
    let post = |body: Vec<u8>, secret: &str| {
        axum::http::Request::post("/telegram/shop/webhook")
            .header("x-telegram-bot-api-secret-token", secret)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    };
    let refused = app
        .clone()
        .oneshot(post(update(5, "hi"), "wrong"))
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let answered = app
        .clone()
        .oneshot(post(update(5, "hi"), SECRET))
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    let hi = next(&mut handed)
        .await
        .expect("the plain message is the bot's");
    assert_eq!(hi.update_id(), 5);
    hi.done();
    // The action's command is opledger's (`updates = "unhandled"`, the default): it starts the
    // operation and never reaches the handlers.
    let command = app
        .clone()
        .oneshot(post(update(6, "/coupon spring"), SECRET))
        .await
        .unwrap();
    assert_eq!(command.status(), 200);
    let found = ledger.operations_of("shop", 42, 10).await.unwrap();
    assert_eq!(found.len(), 1, "the command started the operation");
    let id = found[0].operation_id.clone();
    let settled = ledger.wait(&id, Duration::from_secs(20)).await.unwrap();
    assert_eq!(settled.status, "confirmed");
    assert!(
        tokio::time::timeout(Duration::from_secs(1), handed.next())
            .await
            .is_err(),
        "opledger's own command is not handed over"
    );
    let page = app
        .oneshot(axum::http::Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    running.shutdown().await;
}

#[tokio::test]
async fn serve_answers_until_shutdown_and_then_closes_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Opledger::builder()
        .ledger(format!("sqlite://{}", dir.path().join("bot.db").display()))
        .bot(bot())
        .open()
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn({
        let ledger = ledger.clone();
        async move {
            ledger
                .serve(listener, async move {
                    let _ = stopped.await;
                })
                .await
        }
    });
    let ready = reqwest::get(format!("http://{address}/readyz"))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let body = update(9, "hello");
    let webhook = reqwest::Client::new()
        .post(format!("http://{address}/telegram/shop/webhook"))
        .header("x-telegram-bot-api-secret-token", SECRET)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(webhook.status(), 200);
    stop.send(()).unwrap();
    serving.await.unwrap().expect("a clean stop");
    assert!(
        reqwest::get(format!("http://{address}/healthz"))
            .await
            .is_err(),
        "no longer listening"
    );
    let again = ledger.record("shop", &body).await;
    assert!(again.is_err(), "the ledger is closed: {again:?}");
}
