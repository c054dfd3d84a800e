//! Every real-shaped update in the shared fixtures goes through the envelope: none is quarantined,
//! and each yields the kind, ids and date written down below by reading the files by hand.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use opledger_telegram::{Update, parse_update};

/// The fixture folder: `$OPLEDGER_TELEGRAM_FIXTURES` if set, else the workspace's copy of the
/// shared fixtures, `tests/fixtures/telegram/updates`.
fn fixtures_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("OPLEDGER_TELEGRAM_FIXTURES") {
        return PathBuf::from(dir);
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/telegram/updates");
    assert!(
        dir.is_dir(),
        "the update fixtures are missing at {}: restore tests/fixtures/telegram/updates from git, \
         or point OPLEDGER_TELEGRAM_FIXTURES at a folder of update files",
        dir.display()
    );
    dir
}

struct Expected {
    file: &'static str,
    kind: &'static str,
    update_id: i64,
    chat_id: Option<i64>,
    user_id: Option<i64>,
}

const fn e(
    file: &'static str,
    kind: &'static str,
    update_id: i64,
    chat_id: Option<i64>,
    user_id: Option<i64>,
) -> Expected {
    Expected {
        file,
        kind,
        update_id,
        chat_id,
        user_id,
    }
}

/// Read from the files by hand. Notes on the less obvious rows are at the end of each line.
#[rustfmt::skip]
const TABLE: &[Expected] = &[
    e("01-message-private-text-link-preview.json", "message", 892252934, Some(218485655), Some(218485655)),
    e("02-message-supergroup-story.json", "message", 439432599, Some(-1001293752024), Some(6962620676)),
    e("03-message-forum-thread-bot-command-reply.json", "message", 439432600, Some(-1001293752024), Some(5964236329)),
    e("04-message-private-text-minimal.json", "message", 306197398, Some(408258968), Some(408258968)),
    e("05-message-service-pinned.json", "message", 845402291, Some(-1001276785818), Some(408258968)),
    e("06-message-dice-unicode-emoji.json", "message", 573255266, Some(-1001276785818), Some(408258968)),
    e("07-odd-unknown-update-kind.json", "other:new_update_kind", 1, None, None),
    e("08-my_chat_member-bot-blocked-private.json", "my_chat_member", 0, Some(0), Some(0)), // ids really are 0
    e("09-message_reaction-user-added.json", "message_reaction", 71651249, Some(-1002184233434), Some(1459074222)),
    e("10-message_reaction-anonymous-actor_chat.json", "message_reaction", 767844136, Some(-1002199793788), Some(-1002199793788)), // actor_chat
    e("11-message_reaction_count-channel.json", "message_reaction_count", 71651251, Some(-1002236736395), None),
    e("12-chat_boost-premium.json", "chat_boost", 71651297, Some(-1002236736395), Some(1459074222)), // the booster
    e("13-removed_chat_boost-same-update_id.json", "removed_chat_boost", 71651297, Some(-1002236736395), Some(1459074222)), // same id as 12
    e("14-purchased_paid_media.json", "purchased_paid_media", 573255267, None, Some(408258968)),
    e("15-poll_answer-vote-retracted.json", "poll_answer", 0, None, Some(42)),
    e("16-odd-unknown-top-level-key.json", "other:something unknown to us", 1, None, None), // scalar value
    e("17-poll_answer-multi.json", "poll_answer", 2, None, Some(42)),
    e("18-odd-malformed-message.json", "message", 3, None, None), // message without any known field
    e("19-callback_query-minimal-missing-chat_instance.json", "callback_query", 1, None, Some(1)),
    e("20-inline_query.json", "inline_query", 1, None, Some(1)),
    e("21-chosen_inline_result.json", "chosen_inline_result", 1, None, Some(1)),
    e("22-shipping_query.json", "shipping_query", 1, None, Some(1)),
    e("23-pre_checkout_query-GEL.json", "pre_checkout_query", 1, None, Some(1)),
    e("24-poll-closed.json", "poll", 1, None, None),
    e("25-poll_answer-persistent-ids.json", "poll_answer", 1, None, Some(1)),
    e("26-chat_join_request-minimal.json", "chat_join_request", 1, Some(1), Some(1)),
    e("27-chat_member-kicked.json", "chat_member", 1, Some(1), Some(1)), // from, not the member (2)
    e("28-business_connection.json", "business_connection", 1, Some(2), Some(1)), // chat = user_chat_id
    e("29-business_message.json", "business_message", 1, Some(1), Some(1)),
    e("30-edited_business_message.json", "edited_business_message", 1, Some(1111), Some(1111)),
    e("31-deleted_business_messages.json", "deleted_business_messages", 1, Some(1), None),
    e("32-channel_post-author_signature.json", "channel_post", 1, Some(1), Some(1)), // sender_chat
    e("33-edited_channel_post.json", "edited_channel_post", 1, Some(1), Some(1)), // sender_chat
    e("34-edited_message.json", "edited_message", 1, Some(1111), Some(1111)),
    e("35-guest_message-new-kind.json", "guest_message", 1, Some(111), Some(112)),
    e("36-managed_bot-new-kind.json", "managed_bot", 1, None, Some(2)), // the creator, not the bot (1)
    e("37-odd-unknown-key-value.json", "other:key", 1, None, None),
    e("38-message-successful_payment.json", "message", 123456789, Some(12345678), Some(12345678)),
    e("39-pre_checkout_query-USD.json", "pre_checkout_query", 123456789, None, Some(12345678)),
    e("40-shipping_query-US.json", "shipping_query", 123456789, None, Some(12345678)),
    e("41-message-invoice.json", "message", 123456789, Some(12345678), Some(12345678)),
    e("42-channel_post-from-null.json", "channel_post", 123456789, Some(-1001065170817), None), // "from": null
    e("43-message-forwarded-legacy-forward-fields-entities.json", "message", 123456789, Some(12345678), Some(12345678)),
    e("44-edited_message-private.json", "edited_message", 123456789, Some(12345678), Some(12345678)),
    e("45-message-reply-to-message.json", "message", 123456789, Some(12345678), Some(12345678)),
    e("46-message-2015-era-update.json", "message", 938203, Some(1111), Some(9734)),
    e("47-message-sticker-unicode-supergroup.json", "message", 890000001, Some(-1001309982000), Some(590740002)),
    e("48-message-poll.json", "message", 890000002, Some(111), Some(111)),
    e("49-callback_query-with-data-inline-keyboard-cyrillic.json", "callback_query", 163399206, Some(436432850), Some(436432850)),
    e("50-message-start-command-without-entities.json", "message", 31348350, Some(436432850), Some(436432850)),
    e("51-odd-derived-ids-max-52bit.json", "message", 2147483647, Some(4503599627370495), Some(4503599627370495)), // 2^52 - 1
    e("52-odd-derived-ids-2pow53-minus-1.json", "message", 9007199254740991, Some(9007199254740991), Some(9007199254740991)), // 2^53 - 1
    e("53-odd-derived-unknown-nested-and-top-level-fields.json", "message", 892252934, Some(218485655), Some(218485655)), // + unknown top-level key
];

fn fixture(name: &str) -> Update {
    let path = fixtures_dir().join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    parse_update(&bytes).unwrap_or_else(|q| panic!("{name} was quarantined: {q}"))
}

#[test]
fn the_table_covers_every_fixture_file() {
    let dir = fixtures_dir();
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .map(|entry| {
            entry
                .expect("a directory entry")
                .file_name()
                .into_string()
                .expect("a UTF-8 file name")
        })
        .filter(|name| name.ends_with(".json"))
        .collect();
    let in_table: BTreeSet<String> = TABLE.iter().map(|row| row.file.to_owned()).collect();
    assert_eq!(TABLE.len(), in_table.len(), "a file is listed twice");
    assert_eq!(
        on_disk.difference(&in_table).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "fixture files missing from the table"
    );
    assert_eq!(
        in_table.difference(&on_disk).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "table rows without a fixture file"
    );
    assert!(on_disk.len() >= 53, "found only {} fixtures", on_disk.len());
}

#[test]
fn every_fixture_parses_with_the_expected_kind_and_ids() {
    let dir = fixtures_dir();
    let mut failures = Vec::new();
    for row in TABLE {
        let bytes =
            std::fs::read(dir.join(row.file)).unwrap_or_else(|e| panic!("read {}: {e}", row.file));
        let update = match parse_update(&bytes) {
            Ok(update) => update,
            Err(q) => {
                failures.push(format!("{}: quarantined ({q})", row.file));
                continue;
            }
        };
        let got = (
            update.kind.as_str().into_owned(),
            update.update_id,
            update.chat_id,
            update.user_id,
        );
        let want = (row.kind.to_owned(), row.update_id, row.chat_id, row.user_id);
        if got != want {
            failures.push(format!("{}: got {got:?}, want {want:?}", row.file));
        }
        if update.size != bytes.len() || update.digest.len() != 64 {
            failures.push(format!("{}: wrong size or digest", row.file));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn ids_near_2_pow_53_stay_exact() {
    let update = fixture("52-odd-derived-ids-2pow53-minus-1.json");
    assert_eq!(update.update_id, (1_i64 << 53) - 1);
    assert_eq!(update.chat_id, Some((1_i64 << 53) - 1));
    let update = fixture("51-odd-derived-ids-max-52bit.json");
    assert_eq!(update.user_id, Some((1_i64 << 52) - 1));
}

#[test]
fn commands_in_the_fixtures() {
    let commands: Vec<(&str, String)> = TABLE
        .iter()
        .filter_map(|row| {
            fixture(row.file)
                .text_command
                .map(|c| (row.file, c.normalized()))
        })
        .collect();
    assert_eq!(
        commands,
        vec![
            (
                "03-message-forum-thread-bot-command-reply.json",
                "report".to_owned()
            ),
            (
                "50-message-start-command-without-entities.json",
                "start".to_owned()
            ),
        ]
    );
}

#[test]
fn callback_queries_in_the_fixtures() {
    let full = fixture("49-callback_query-with-data-inline-keyboard-cyrillic.json");
    let callback = full.callback.expect("a callback");
    assert_eq!(callback.id, "1874464818486990916");
    assert_eq!(callback.data.as_deref(), Some("K0ktLokvzsgvj6+oKquqACIA"));
    assert_eq!(callback.from_user_id, Some(436432850));
    assert_eq!(callback.chat_id, Some(436432850));
    assert_eq!(callback.message_id, Some(1054));
    assert_eq!(full.message_date.map(|d| d.timestamp()), Some(1611138080));

    let minimal = fixture("19-callback_query-minimal-missing-chat_instance.json");
    let callback = minimal.callback.expect("a callback");
    assert_eq!(callback.id, "query-id");
    assert_eq!(
        (callback.data, callback.chat_id, callback.message_id),
        (None, None, None)
    );
    assert_eq!(minimal.message_date, None);
}

#[test]
fn dates_in_the_fixtures() {
    let date = |file| fixture(file).message_date.map(|d| d.timestamp());
    assert_eq!(
        date("01-message-private-text-link-preview.json"),
        Some(1569518342)
    );
    assert_eq!(
        date("08-my_chat_member-bot-blocked-private.json"),
        Some(1644677726)
    );
    assert_eq!(date("12-chat_boost-premium.json"), Some(1721399621));
    assert_eq!(
        date("13-removed_chat_boost-same-update_id.json"),
        Some(1721999621)
    );
    // tgbot's synthetic payloads say `"date": 0`: no date.
    assert_eq!(date("29-business_message.json"), None);
    assert_eq!(date("24-poll-closed.json"), None);
}

#[test]
fn same_update_id_different_bodies_have_different_digests() {
    let boost = fixture("12-chat_boost-premium.json");
    let removed = fixture("13-removed_chat_boost-same-update_id.json");
    assert_eq!(boost.update_id, removed.update_id);
    assert_ne!(boost.digest, removed.digest);
}
