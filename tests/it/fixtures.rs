//! Every shared Telegram update fixture, posted through the webhook like Telegram would: each is
//! acknowledged and recorded, with the kind and ids the update parser reads from the same bytes
//! (issue 4 §1; DESIGN §6: "never reject the future", ids are `i64`, no truncation near 2^53).
//!
//! The parser has its own table test of every fixture; this test checks the other half: what
//! the service records is what the parser says, byte for byte the same body.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use chrono::{DateTime, TimeDelta, Utc};
use opledger_store::{EventStore, RecordedEvent};
use opledger_telegram::parse_update;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::app::{Backend, Ledger, TestApp, config, on_both_backends};

on_both_backends!(every_fixture_is_acknowledged_and_recorded_as_the_parser_reads_it);

/// Fixtures that reuse an `update_id` an earlier fixture (in file-name order) already used,
/// with a different body. Posted in file-name order within the retention window, each of these
/// is an `UpdateIdCollision` (acknowledged, not processed), never a second `UpdateReceived`:
///
/// - `update_id` 0: 08 first, then 15;
/// - `update_id` 1: 07 first, then 16 and every tgbot snapshot (19-37);
/// - `update_id` 71651297: 12 first, then 13;
/// - `update_id` 123456789: 38 first, then every aiogram-composed update (39-45);
/// - `update_id` 892252934: 01 first, then 53 (derived from 01 with extra unknown fields).
const COLLISIONS: &[&str] = &[
    "13-removed_chat_boost-same-update_id.json",
    "15-poll_answer-vote-retracted.json",
    "16-odd-unknown-top-level-key.json",
    "19-callback_query-minimal-missing-chat_instance.json",
    "20-inline_query.json",
    "21-chosen_inline_result.json",
    "22-shipping_query.json",
    "23-pre_checkout_query-GEL.json",
    "24-poll-closed.json",
    "25-poll_answer-persistent-ids.json",
    "26-chat_join_request-minimal.json",
    "27-chat_member-kicked.json",
    "28-business_connection.json",
    "29-business_message.json",
    "30-edited_business_message.json",
    "31-deleted_business_messages.json",
    "32-channel_post-author_signature.json",
    "33-edited_channel_post.json",
    "34-edited_message.json",
    "35-guest_message-new-kind.json",
    "36-managed_bot-new-kind.json",
    "37-odd-unknown-key-value.json",
    "39-pre_checkout_query-USD.json",
    "40-shipping_query-US.json",
    "41-message-invoice.json",
    "42-channel_post-from-null.json",
    "43-message-forwarded-legacy-forward-fields-entities.json",
    "44-edited_message-private.json",
    "45-message-reply-to-message.json",
    "53-odd-derived-unknown-nested-and-top-level-fields.json",
];

/// Kinds checked by name, not only against the parser: the unknown kinds (`other:<key>`), the
/// newest known ones, and a known kind carrying unknown fields.
const KINDS: &[(&str, &str)] = &[
    ("07-odd-unknown-update-kind.json", "other:new_update_kind"),
    (
        "16-odd-unknown-top-level-key.json",
        "other:something unknown to us",
    ),
    ("37-odd-unknown-key-value.json", "other:key"),
    ("35-guest_message-new-kind.json", "guest_message"),
    ("36-managed_bot-new-kind.json", "managed_bot"),
    (
        "53-odd-derived-unknown-nested-and-top-level-fields.json",
        "message",
    ),
    (
        "49-callback_query-with-data-inline-keyboard-cyrillic.json",
        "callback_query",
    ),
    (
        "11-message_reaction_count-channel.json",
        "message_reaction_count",
    ),
];

/// The dedup retention the test configuration uses (the default): past it, an id is new again.
const RETENTION: TimeDelta = TimeDelta::hours(72);

/// The workspace's copy of the shared update fixtures (`tests/fixtures/telegram/updates`).
fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/telegram/updates")
}

/// Every `*.json` fixture, in file-name order, with its exact bytes.
fn fixtures() -> Vec<(String, Vec<u8>)> {
    let dir = fixtures_dir();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|error| {
        panic!(
            "the Telegram update fixtures are missing at {} ({error}); restore \
             tests/fixtures/telegram/updates from git",
            dir.display()
        )
    });
    let mut files: Vec<(String, Vec<u8>)> = entries
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).expect("read a fixture");
            (name, bytes)
        })
        .collect();
    files.sort();
    assert!(
        files.len() >= 50,
        "expected the ~53 shared update fixtures in {}, found {}",
        dir.display(),
        files.len()
    );
    files
}

fn payload(event: &RecordedEvent) -> Value {
    serde_json::from_slice(&event.payload).expect("payloads are JSON")
}

/// Posts `body` and returns the events that answer appended, checking it was acknowledged.
async fn post(app: &TestApp, name: &str, body: &[u8]) -> Vec<RecordedEvent> {
    let before = app.store.head().await.expect("head").position;
    let response = app.deliver(body.to_vec()).await;
    assert_eq!(response.status(), StatusCode::OK, "{name} is acknowledged");
    app.store
        .read_all(before + 1, 1_000)
        .await
        .expect("read the new events")
}

/// Asserts that a recorded `UpdateReceived` holds what the parser reads from the same bytes.
fn assert_recorded_as_parsed(name: &str, body: &[u8], event: &RecordedEvent, epoch: u32) {
    let update = parse_update(body).unwrap_or_else(|q| panic!("{name} parses: {q:?}"));
    let recorded = payload(event);
    assert_eq!(event.event_type, "UpdateReceived", "{name}");
    assert_eq!(
        event.stream_id.as_str(),
        format!("update-shop-{}", update.update_id),
        "{name}"
    );
    assert_eq!(recorded["bot"], "shop", "{name}");
    // as_i64 on the stored JSON: an id near 2^53 read back exactly, not through a float.
    assert_eq!(
        recorded["update_id"].as_i64(),
        Some(update.update_id),
        "{name}"
    );
    assert_eq!(recorded["epoch"].as_u64(), Some(u64::from(epoch)), "{name}");
    assert_eq!(recorded["kind"], update.kind.as_str().as_ref(), "{name}");
    assert_eq!(recorded["chat_id"].as_i64(), update.chat_id, "{name}");
    assert_eq!(recorded["user_id"].as_i64(), update.user_id, "{name}");
    let date = recorded["message_date"].as_str().map(|d| {
        DateTime::parse_from_rfc3339(d)
            .expect("an RFC 3339 date")
            .with_timezone(&Utc)
    });
    assert_eq!(date, update.message_date, "{name}");
    assert_eq!(recorded["digest"], update.digest.as_str(), "{name}");
    assert_eq!(recorded["size"].as_u64(), Some(body.len() as u64), "{name}");
    assert!(
        recorded["operation"].is_null(),
        "{name}: no action is configured"
    );
}

async fn every_fixture_is_acknowledged_and_recorded_as_the_parser_reads_it(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let files = fixtures();
    let app = TestApp::spawn(&ledger, &config("")).await;

    // The expectation, computed from the files: the first body under an id is received, a
    // later different body under the same id collides. It must be the documented list.
    let mut first_by_id: HashMap<i64, (String, String)> = HashMap::new();
    let mut expected_collisions = Vec::new();
    for (name, body) in &files {
        let update = parse_update(body).unwrap_or_else(|q| panic!("{name} parses: {q:?}"));
        match first_by_id.get(&update.update_id) {
            None => {
                first_by_id.insert(update.update_id, (name.clone(), update.digest.clone()));
            }
            Some((first, digest)) => {
                assert_ne!(
                    *digest, update.digest,
                    "{name} is byte-identical to {first}: that is a duplicate, not a collision"
                );
                expected_collisions.push(name.as_str());
            }
        }
    }
    assert_eq!(expected_collisions, COLLISIONS, "the documented collisions");

    // Every fixture within one retention window, in file-name order.
    let mut received: HashMap<String, RecordedEvent> = HashMap::new();
    let mut collided = Vec::new();
    for (name, body) in &files {
        let update = parse_update(body).expect("parsed above");
        let events = post(&app, name, body).await;
        assert_eq!(
            events.len(),
            1,
            "{name}: one event on its delivery stream and nothing else: {:?}",
            events
                .iter()
                .map(|e| e.stream_id.as_str())
                .collect::<Vec<_>>()
        );
        let event = &events[0];
        assert_eq!(
            event.stream_id.as_str(),
            format!("update-shop-{}", update.update_id),
            "{name}"
        );
        match event.event_type.as_str() {
            "UpdateReceived" => {
                assert_recorded_as_parsed(name, body, event, 1);
                received.insert(name.clone(), event.clone());
            }
            "UpdateIdCollision" => {
                let collision = payload(event);
                let (first, first_digest) = &first_by_id[&update.update_id];
                assert_eq!(collision["epoch"], 1, "{name}");
                assert_eq!(
                    collision["first_digest"],
                    first_digest.as_str(),
                    "{name} collides with {first}"
                );
                assert_eq!(collision["new_digest"], update.digest.as_str(), "{name}");
                collided.push(name.as_str());
            }
            other => panic!("{name} was recorded as {other}"),
        }
    }
    assert_eq!(collided, COLLISIONS, "exactly the reused ids collide");
    assert_eq!(received.len() + collided.len(), files.len());

    // Past the retention window an id is a new update again (Telegram restarts ids after a week
    // of silence): each colliding fixture, posted once the window since the previous epoch has
    // passed, opens a new epoch and is recorded as the parser reads it too.
    let mut epochs: HashMap<i64, u32> = first_by_id.keys().map(|id| (*id, 1)).collect();
    for name in COLLISIONS {
        let (_, body) = files.iter().find(|(n, _)| n == name).expect("listed");
        let update_id = parse_update(body).expect("parsed above").update_id;
        app.clock.advance(RETENTION + TimeDelta::hours(1));
        let events = post(&app, name, body).await;
        assert_eq!(events.len(), 1, "{name}");
        let epoch = epochs.get_mut(&update_id).expect("seen");
        *epoch += 1;
        assert_recorded_as_parsed(name, body, &events[0], *epoch);
        received.insert((*name).to_owned(), events[0].clone());
    }
    assert_eq!(received.len(), files.len(), "every fixture recorded once");

    for (name, kind) in KINDS {
        let event = received
            .get(*name)
            .unwrap_or_else(|| panic!("{name} is a fixture"));
        assert_eq!(payload(event)["kind"], *kind, "{name}");
    }
    // Ids beyond 32 bits and up to 2^53 - 1 are kept exactly.
    let max_53 = payload(&received["52-odd-derived-ids-2pow53-minus-1.json"]);
    assert_eq!(max_53["update_id"].as_i64(), Some(9_007_199_254_740_991));
    assert_eq!(max_53["chat_id"].as_i64(), Some(9_007_199_254_740_991));
    assert_eq!(max_53["user_id"].as_i64(), Some(9_007_199_254_740_991));
    let max_52 = payload(&received["51-odd-derived-ids-max-52bit.json"]);
    assert_eq!(max_52["update_id"].as_i64(), Some(2_147_483_647));
    assert_eq!(max_52["chat_id"].as_i64(), Some(4_503_599_627_370_495));
    assert_eq!(max_52["user_id"].as_i64(), Some(4_503_599_627_370_495));
    let supergroup = payload(&received["47-message-sticker-unicode-supergroup.json"]);
    assert_eq!(supergroup["chat_id"].as_i64(), Some(-1_001_309_982_000));

    app.stop().await;
}
