//! The Bot API client against the project's fake Telegram (`tests/it/support/fake_telegram.rs`):
//! long polling with offset confirmation, Telegram's refusals, webhook state and replies. It
//! tests the fake as much as the client, so the black-box tests can trust it.

use std::time::{Duration, Instant};

use opledger_telegram::{BotApi, BotApiError, SetWebhook};
use secrecy::SecretString;

use crate::fake_telegram::{FakeMode, FakeTelegram};

const TOKEN: &str = "4242:FAKE-token_for_tests";

fn client(fake: &FakeTelegram) -> BotApi {
    client_with_token(fake, TOKEN)
}

fn client_with_token(fake: &FakeTelegram, token: &str) -> BotApi {
    BotApi::new(
        &fake.base_url(),
        SecretString::from(token),
        BotApi::http_client().expect("an http client"),
    )
    .expect("a valid base url and token")
    .with_request_timeout(Duration::from_secs(5))
}

fn update(id: i64) -> Vec<u8> {
    // Odd spacing on purpose: the bytes must come back unchanged.
    format!("{{ \"update_id\" : {id},\n  \"message\": {{\"chat\": {{\"id\": 7}}, \"text\": \"/start  x\"}} }}")
        .into_bytes()
}

#[tokio::test]
async fn polling_returns_exact_bytes_and_offsets_confirm() {
    let fake = FakeTelegram::start(TOKEN).await;
    let api = client(&fake);
    fake.push_update(update(100));
    fake.push_update(update(101));
    fake.push_update(update(102));

    let batch = api.get_updates(None, 2, 0, None).await.expect("a batch");
    assert_eq!(batch.len(), 2, "the limit is honoured");
    assert_eq!(batch[0].bytes, update(100));
    assert_eq!(batch[1].bytes, update(101));
    assert_eq!(fake.confirmed_offset(), None);

    // Nothing is confirmed until an offset above it is passed: the same batch comes again.
    let again = api.get_updates(None, 2, 0, None).await.expect("a batch");
    assert_eq!(again, batch);

    let last = batch[1].parse().expect("an update").update_id;
    let rest = api
        .get_updates(Some(last + 1), 100, 0, None)
        .await
        .expect("a batch");
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].parse().expect("an update").update_id, 102);
    assert_eq!(fake.confirmed_offset(), Some(102));
    assert_eq!(fake.pending_updates(), 1);

    // The graceful-shutdown confirmation: offset = last + 1, limit 1, timeout 0.
    let empty = api
        .get_updates(Some(103), 1, 0, None)
        .await
        .expect("a batch");
    assert!(empty.is_empty());
    assert_eq!(fake.confirmed_offset(), Some(103));
    assert_eq!(fake.pending_updates(), 0);

    let calls = fake.calls("getUpdates");
    assert_eq!(calls.len(), 4);
    assert_eq!(calls[3]["offset"], 103);
    assert_eq!(calls[3]["limit"], 1);
    assert_eq!(calls[3]["timeout"], 0);
}

#[tokio::test]
async fn a_long_poll_wakes_when_an_update_is_pushed() {
    let fake = FakeTelegram::start(TOKEN).await;
    let api = client(&fake);
    let started = Instant::now();
    let (batch, ()) = tokio::join!(api.get_updates(None, 100, 20, None), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        fake.push_update(update(5));
    });
    let batch = batch.expect("a batch");
    assert_eq!(batch.len(), 1);
    assert!(started.elapsed() < Duration::from_secs(10), "woke early");
}

#[tokio::test]
async fn a_long_poll_without_updates_waits_for_its_timeout() {
    let fake = FakeTelegram::start(TOKEN).await;
    let started = Instant::now();
    let batch = client(&fake)
        .get_updates(None, 100, 1, None)
        .await
        .expect("a batch");
    assert!(batch.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[tokio::test]
async fn a_second_poller_terminates_the_first() {
    let fake = FakeTelegram::start(TOKEN).await;
    let api = client(&fake);
    let (first, second) = tokio::join!(api.get_updates(None, 100, 20, None), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        api.get_updates(None, 100, 0, None).await
    });
    let error = first.expect_err("terminated");
    assert!(
        matches!(&error, BotApiError::Conflict { description, .. } if description.contains("terminated by other getUpdates request")),
        "{error:?}"
    );
    assert!(second.expect("the newer poll works").is_empty());
}

#[tokio::test]
async fn conflict_and_unauthorized_modes() {
    let fake = FakeTelegram::start(TOKEN).await;
    let api = client(&fake);

    fake.set_mode(FakeMode::Conflict);
    let error = api.get_updates(None, 100, 0, None).await.expect_err("409");
    assert!(matches!(error, BotApiError::Conflict { .. }), "{error:?}");
    api.send_message(1, "other methods still work")
        .await
        .expect("sent");

    fake.set_mode(FakeMode::Unauthorized);
    let error = api.send_message(1, "x").await.expect_err("401");
    assert!(
        matches!(error, BotApiError::Unauthorized { .. }),
        "{error:?}"
    );

    fake.set_mode(FakeMode::Normal);
    api.get_updates(None, 100, 0, None)
        .await
        .expect("polls again");
}

#[tokio::test]
async fn a_wrong_token_is_unauthorized_and_not_recorded() {
    let fake = FakeTelegram::start(TOKEN).await;
    let error = client_with_token(&fake, "4242:WRONG")
        .get_updates(None, 100, 0, None)
        .await
        .expect_err("401");
    assert!(matches!(
        error,
        BotApiError::Unauthorized {
            method: "getUpdates"
        }
    ));
    assert!(!error.to_string().contains("WRONG"));
    assert_eq!(fake.unauthorized_calls(), 1);
    assert!(fake.all_calls().is_empty());
}

#[tokio::test]
async fn webhook_state_and_its_conflict_with_polling() {
    let fake = FakeTelegram::start(TOKEN).await;
    let api = client(&fake);
    fake.push_update(update(1));

    let info = api.get_webhook_info().await.expect("info");
    assert_eq!(info.url, "");
    assert_eq!(info.pending_update_count, 1);

    api.set_webhook(&SetWebhook {
        url: "https://bot.example.org/telegram/shop/webhook".to_owned(),
        secret_token: SecretString::from("the-secret_1"),
        allowed_updates: vec!["message".to_owned()],
        max_connections: Some(5),
        drop_pending_updates: false,
    })
    .await
    .expect("set");
    let webhook = fake.webhook().expect("a webhook");
    assert_eq!(webhook.url, "https://bot.example.org/telegram/shop/webhook");
    assert_eq!(webhook.secret_token.as_deref(), Some("the-secret_1"));
    assert_eq!(webhook.allowed_updates, Some(vec!["message".to_owned()]));
    assert_eq!(webhook.max_connections, Some(5));
    assert!(
        fake.calls("setWebhook")[0]
            .get("drop_pending_updates")
            .is_none()
    );

    let info = api.get_webhook_info().await.expect("info");
    assert_eq!(info.url, webhook.url);
    assert_eq!(info.pending_update_count, 1, "pending updates were kept");
    assert_eq!(info.max_connections, Some(5));
    assert_eq!(info.allowed_updates, Some(vec!["message".to_owned()]));

    let error = api.get_updates(None, 100, 0, None).await.expect_err("409");
    assert!(
        matches!(&error, BotApiError::Conflict { description, .. } if description.contains("webhook is active")),
        "{error:?}"
    );

    api.delete_webhook(false).await.expect("deleted");
    assert_eq!(fake.webhook(), None);
    assert_eq!(
        fake.pending_updates(),
        1,
        "deleting the webhook keeps pending updates"
    );
    assert_eq!(
        api.get_updates(None, 100, 0, None)
            .await
            .expect("polls")
            .len(),
        1
    );

    api.delete_webhook(true).await.expect("deleted");
    assert_eq!(fake.pending_updates(), 0, "dropped on explicit request");
}

#[tokio::test]
async fn replies_get_increasing_ids_and_flood_control_is_scripted() {
    let fake = FakeTelegram::start(TOKEN).await;
    let api = client(&fake);
    let first = api.send_message(7, "one").await.expect("sent");
    fake.script_send_message_retry_after(3);
    let error = api.send_message(7, "two").await.expect_err("429");
    assert!(
        matches!(error, BotApiError::RetryAfter { seconds: 3, .. }),
        "{error:?}"
    );
    assert!(error.is_definitely_not_delivered());
    let second = api.send_message(7, "two").await.expect("sent");
    assert!(second.message_id > first.message_id);
    let texts: Vec<String> = fake
        .calls("sendMessage")
        .iter()
        .map(|call| call["text"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(texts, ["one", "two", "two"]);

    api.answer_callback_query("cb-1", Some("ok"))
        .await
        .expect("answered");
    assert_eq!(
        fake.calls("answerCallbackQuery")[0]["callback_query_id"],
        "cb-1"
    );
}
