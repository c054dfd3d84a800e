//! The Bot API client against small scripted servers on loopback: what it sends, how it sorts
//! every kind of failure, and that the token never shows in an error or in `Debug`.

use std::error::Error as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::any;
use opledger_telegram::{BotApi, BotApiError, SetWebhook};
use secrecy::SecretString;
use serde_json::{Value, json};

const CANARY: &str = "123456:CANARY-SECRET-TOKEN";

/// What a scripted server received: the path's `bot…` segment, the method and the JSON body.
type Received = Arc<Mutex<Vec<(String, String, Value)>>>;

/// Serves every `/{bot}/{method}` with `status` and `body` after `delay`, recording requests.
async fn scripted(status: u16, body: &'static str, delay: Duration) -> (String, Received) {
    let received: Received = Arc::default();
    let app = Router::new()
        .route(
            "/{bot}/{method}",
            any(
                move |State(received): State<Received>,
                      Path((bot, method)): Path<(String, String)>,
                      request: Bytes| async move {
                    let request = serde_json::from_slice(&request).unwrap_or(Value::Null);
                    received
                        .lock()
                        .expect("not poisoned")
                        .push((bot, method, request));
                    tokio::time::sleep(delay).await;
                    (
                        StatusCode::from_u16(status).expect("a valid status"),
                        [("content-type", "application/json")],
                        body,
                    )
                },
            ),
        )
        .with_state(Arc::clone(&received));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (format!("http://{addr}"), received)
}

/// A server that reads the request and hangs up without answering: the request was sent, the
/// outcome is unknown.
async fn hangs_up() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let mut buf = [0_u8; 4096];
            if socket.readable().await.is_ok() {
                let _ = socket.try_read(&mut buf);
            }
            drop(socket);
        }
    });
    format!("http://{addr}")
}

/// A loopback URL where nothing listens.
async fn closed_port() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("an address");
    drop(listener);
    format!("http://{addr}")
}

fn api(base_url: &str) -> BotApi {
    BotApi::new(
        base_url,
        SecretString::from(CANARY),
        BotApi::http_client().expect("an http client"),
    )
    .expect("a valid base url and token")
    .with_request_timeout(Duration::from_millis(500))
}

/// Neither the error nor anything in its source chain shows the token, in Display or Debug.
fn assert_no_token(error: &BotApiError) {
    let mut shown = vec![
        error.to_string(),
        format!("{error:?}"),
        format!("{error:#?}"),
    ];
    let mut source = error.source();
    while let Some(inner) = source {
        shown.push(inner.to_string());
        shown.push(format!("{inner:?}"));
        source = inner.source();
    }
    for text in shown {
        assert!(
            !text.contains("CANARY-SECRET-TOKEN") && !text.contains("123456:"),
            "the token leaked: {text}"
        );
    }
}

#[tokio::test]
async fn failures_are_sorted_and_never_show_the_token() {
    let slow = scripted(
        200,
        r#"{"ok":true,"result":{"message_id":1}}"#,
        Duration::from_secs(5),
    )
    .await
    .0;
    let cases: Vec<(String, &str, bool)> = vec![
        (closed_port().await, "Unreachable", true),
        (slow, "Timeout", false),
        (hangs_up().await, "Transport", false),
        (
            scripted(500, r#"{"ok":false,"error_code":500,"description":"Internal Server Error"}"#, Duration::ZERO).await.0,
            "Api",
            false,
        ),
        (scripted(502, "<html>bad gateway</html>", Duration::ZERO).await.0, "Api", false),
        (
            scripted(409, r#"{"ok":false,"error_code":409,"description":"Conflict: terminated by other getUpdates request"}"#, Duration::ZERO).await.0,
            "Conflict",
            true,
        ),
        (
            scripted(429, r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 17","parameters":{"retry_after":17}}"#, Duration::ZERO).await.0,
            "RetryAfter",
            true,
        ),
        (
            scripted(401, r#"{"ok":false,"error_code":401,"description":"Unauthorized"}"#, Duration::ZERO).await.0,
            "Unauthorized",
            true,
        ),
        (
            scripted(403, r#"{"ok":false,"error_code":403,"description":"Forbidden: bot was blocked by the user"}"#, Duration::ZERO).await.0,
            "Api",
            true,
        ),
        (scripted(200, "not json", Duration::ZERO).await.0, "Decode", false),
    ];
    for (base_url, variant, not_delivered) in cases {
        let error = api(&base_url)
            .send_message(42, "hello")
            .await
            .expect_err("a failure");
        assert!(
            format!("{error:?}").starts_with(variant),
            "{variant}: got {error:?}"
        );
        assert_eq!(
            error.is_definitely_not_delivered(),
            not_delivered,
            "{error:?}"
        );
        assert_eq!(error.method(), Some("sendMessage"));
        assert_no_token(&error);
    }
}

#[tokio::test]
async fn retry_after_carries_the_seconds_and_unauthorized_says_check_the_token() {
    let (base, _) = scripted(
        429,
        r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 17","parameters":{"retry_after":17}}"#,
        Duration::ZERO,
    )
    .await;
    let error = api(&base).send_message(1, "x").await.expect_err("429");
    assert!(matches!(
        error,
        BotApiError::RetryAfter {
            seconds: 17,
            method: "sendMessage"
        }
    ));

    let (base, _) = scripted(
        401,
        r#"{"ok":false,"error_code":401,"description":"Unauthorized"}"#,
        Duration::ZERO,
    )
    .await;
    let error = api(&base).get_webhook_info().await.expect_err("401");
    assert!(error.to_string().contains("check the bot token"), "{error}");
}

#[tokio::test]
async fn debug_of_the_client_hides_the_token() {
    let client = api("http://user:pass@127.0.0.1:9/prefix");
    for shown in [format!("{client:?}"), format!("{client:#?}")] {
        assert!(!shown.contains("CANARY"), "{shown}");
        assert!(!shown.contains("123456"), "{shown}");
        assert!(!shown.contains("pass"), "{shown}");
    }
}

#[tokio::test]
async fn the_token_goes_into_the_path_only() {
    let (base, received) = scripted(200, r#"{"ok":true,"result":true}"#, Duration::ZERO).await;
    api(&base)
        .answer_callback_query("q-1", Some("done"))
        .await
        .expect("answered");
    api(&base)
        .answer_callback_query("q-2", None)
        .await
        .expect("answered");
    let received = received.lock().expect("not poisoned").clone();
    assert_eq!(
        received,
        vec![
            (
                format!("bot{CANARY}"),
                "answerCallbackQuery".to_owned(),
                json!({"callback_query_id": "q-1", "text": "done"})
            ),
            (
                format!("bot{CANARY}"),
                "answerCallbackQuery".to_owned(),
                json!({"callback_query_id": "q-2"})
            ),
        ]
    );
}

#[tokio::test]
async fn get_updates_returns_each_update_byte_for_byte() {
    let (base, received) = scripted(
        200,
        "{\"ok\":true,\"result\":[ {\"update_id\": 10,  \"message\" : {\"text\":\"a  b\"}} ,\n{\"update_id\":11}]}",
        Duration::ZERO,
    )
    .await;
    let kinds = vec!["message".to_owned(), "callback_query".to_owned()];
    let updates = api(&base)
        .get_updates(Some(10), 0, 0, Some(&kinds))
        .await
        .expect("updates");
    let bytes: Vec<&[u8]> = updates.iter().map(|u| u.bytes.as_slice()).collect();
    assert_eq!(
        bytes,
        vec![
            b"{\"update_id\": 10,  \"message\" : {\"text\":\"a  b\"}}".as_slice(),
            b"{\"update_id\":11}".as_slice(),
        ]
    );
    let first = updates[0].parse().expect("an update");
    assert_eq!(first.update_id, 10);
    assert_eq!(first.size, bytes[0].len());
    assert!(
        !format!("{:?}", updates[0]).contains("a  b"),
        "Debug hides the bytes"
    );

    let received = received.lock().expect("not poisoned").clone();
    assert_eq!(received[0].1, "getUpdates");
    // The limit is clamped into Telegram's 1..=100.
    assert_eq!(
        received[0].2,
        json!({"offset": 10, "limit": 1, "timeout": 0, "allowed_updates": ["message", "callback_query"]})
    );
}

#[tokio::test]
async fn get_updates_without_offset_or_kinds_sends_neither() {
    let (base, received) = scripted(200, r#"{"ok":true,"result":[]}"#, Duration::ZERO).await;
    let updates = api(&base)
        .get_updates(None, 200, 0, None)
        .await
        .expect("updates");
    assert!(updates.is_empty());
    let received = received.lock().expect("not poisoned").clone();
    assert_eq!(received[0].2, json!({"limit": 100, "timeout": 0}));
}

#[tokio::test]
async fn a_negative_offset_is_refused_before_sending() {
    let (base, received) = scripted(200, r#"{"ok":true,"result":[]}"#, Duration::ZERO).await;
    let error = api(&base)
        .get_updates(Some(-1), 1, 0, None)
        .await
        .expect_err("refused");
    assert!(matches!(error, BotApiError::InvalidArgument { .. }));
    assert!(error.is_definitely_not_delivered());
    assert!(received.lock().expect("not poisoned").is_empty());
}

#[tokio::test]
async fn a_long_poll_may_outlast_the_request_timeout() {
    // The server answers after 1 s; the client allows 500 ms per call, and a long poll of 2 s
    // gets 2.5 s.
    let (base, _) = scripted(200, r#"{"ok":true,"result":[]}"#, Duration::from_secs(1)).await;
    let client = api(&base);
    client
        .get_updates(None, 100, 2, None)
        .await
        .expect("a long poll gets its own timeout plus the request timeout");
    let error = client.send_message(1, "x").await.expect_err("too slow");
    assert!(matches!(error, BotApiError::Timeout { .. }), "{error:?}");
}

#[tokio::test]
async fn set_webhook_sends_the_fields_and_drops_pending_updates_only_on_request() {
    let (base, received) = scripted(
        200,
        r#"{"ok":true,"result":true,"description":"Webhook was set"}"#,
        Duration::ZERO,
    )
    .await;
    let client = api(&base);
    let mut request = SetWebhook {
        url: "https://bot.example.org/telegram/shop/webhook".to_owned(),
        secret_token: SecretString::from("s3cret_TOKEN-1"),
        allowed_updates: vec!["message".to_owned(), "callback_query".to_owned()],
        max_connections: Some(10),
        drop_pending_updates: false,
    };
    assert!(
        !format!("{request:?}").contains("s3cret"),
        "Debug hides the secret"
    );
    client.set_webhook(&request).await.expect("set");
    request.max_connections = None;
    request.drop_pending_updates = true;
    client.set_webhook(&request).await.expect("set");
    let received = received.lock().expect("not poisoned").clone();
    assert_eq!(received[0].1, "setWebhook");
    assert_eq!(
        received[0].2,
        json!({
            "url": "https://bot.example.org/telegram/shop/webhook",
            "secret_token": "s3cret_TOKEN-1",
            "allowed_updates": ["message", "callback_query"],
            "max_connections": 10
        })
    );
    assert_eq!(
        received[1].2,
        json!({
            "url": "https://bot.example.org/telegram/shop/webhook",
            "secret_token": "s3cret_TOKEN-1",
            "allowed_updates": ["message", "callback_query"],
            "drop_pending_updates": true
        })
    );
}

#[tokio::test]
async fn set_webhook_refuses_a_secret_telegram_would_reject() {
    let (base, received) = scripted(200, r#"{"ok":true,"result":true}"#, Duration::ZERO).await;
    for secret in [String::new(), "has space".to_owned(), "x".repeat(257)] {
        let request = SetWebhook {
            url: "https://bot.example.org/hook".to_owned(),
            secret_token: SecretString::from(secret.clone()),
            allowed_updates: Vec::new(),
            max_connections: None,
            drop_pending_updates: false,
        };
        let error = api(&base).set_webhook(&request).await.expect_err("refused");
        assert!(matches!(error, BotApiError::InvalidArgument { .. }));
        if !secret.is_empty() {
            assert!(!error.to_string().contains(&secret), "{error}");
        }
    }
    assert!(received.lock().expect("not poisoned").is_empty());
}

#[tokio::test]
async fn webhook_info_is_read_tolerantly() {
    let (base, _) = scripted(
        200,
        r#"{"ok":true,"result":{"url":"https://bot.example.org/hook","pending_update_count":"3",
            "last_error_date":1700000000,"last_error_message":"Wrong response from the webhook: 503 Service Unavailable",
            "max_connections":40,"allowed_updates":["message",7]}}"#,
        Duration::ZERO,
    )
    .await;
    let info = api(&base).get_webhook_info().await.expect("info");
    assert_eq!(info.url, "https://bot.example.org/hook");
    assert_eq!(info.pending_update_count, 0, "a mistyped count reads as 0");
    assert!(!info.has_custom_certificate);
    assert_eq!(
        info.last_error_date.map(|d| d.timestamp()),
        Some(1_700_000_000)
    );
    assert_eq!(
        info.last_error_message.as_deref(),
        Some("Wrong response from the webhook: 503 Service Unavailable")
    );
    assert_eq!(info.last_synchronization_error_date, None);
    assert_eq!(info.max_connections, Some(40));
    assert_eq!(info.allowed_updates, Some(vec!["message".to_owned()]));
    assert_eq!(info.ip_address, None);
}

#[tokio::test]
async fn delete_webhook_and_send_message_bodies() {
    let (base, received) = scripted(
        200,
        r#"{"ok":true,"result":{"message_id":77,"chat":{"id":-100},"date":1}}"#,
        Duration::ZERO,
    )
    .await;
    let client = api(&base);
    let sent = client
        .send_message(-1_001_309_982_000, "héllo")
        .await
        .expect("sent");
    assert_eq!(sent.message_id, 77);
    client.delete_webhook(false).await.expect("deleted");
    client.delete_webhook(true).await.expect("deleted");
    let received = received.lock().expect("not poisoned").clone();
    let bodies: Vec<(String, Value)> = received.into_iter().map(|(_, m, b)| (m, b)).collect();
    assert_eq!(
        bodies,
        vec![
            (
                "sendMessage".to_owned(),
                json!({"chat_id": -1_001_309_982_000_i64, "text": "héllo"})
            ),
            ("deleteWebhook".to_owned(), json!({})),
            (
                "deleteWebhook".to_owned(),
                json!({"drop_pending_updates": true})
            ),
        ]
    );
}

#[tokio::test]
async fn a_sent_message_without_an_id_is_a_decode_error() {
    let (base, _) = scripted(
        200,
        r#"{"ok":true,"result":{"text":"private words"}}"#,
        Duration::ZERO,
    )
    .await;
    let error = api(&base).send_message(1, "x").await.expect_err("no id");
    assert!(matches!(error, BotApiError::Decode { .. }));
    assert!(!error.is_definitely_not_delivered());
    assert!(!error.to_string().contains("private words"));
}
