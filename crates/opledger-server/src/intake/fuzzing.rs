//! The bodies of the intake's fuzz targets (`fuzz/`), shared with the corpus replay tests
//! (`tests/it/fuzz_corpus.rs`) so that CI checks every corpus input against the same invariants
//! without nightly. Each function takes arbitrary bytes and panics when an invariant breaks; it
//! is not an API.
//!
//! Both run the intake decision exactly as [`Intake::record`](super::Intake::record) does after
//! reading a webhook body, on a fresh ledger (every stream new, as the first attempt assumes),
//! with a fixed configuration of three actions.

use std::collections::HashMap;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use opledger_config::Config;
use opledger_domain::delivery::{Delivery, DeliveryEvent};
use opledger_domain::operation::OperationEvent;
use opledger_domain::quarantine::{QuarantineEvent, quarantine_stream};
use opledger_domain::{OperationId, delivery_stream, fingerprint};
use opledger_ledger::{Changes, Snapshot, Undecided};
use opledger_store::StreamId;
use opledger_telegram::{Update, parse_update};

use super::Route;
use super::decision::{self, Arrival, Decided, IssuedToken, Rules};

const BOT: &str = "shop";

/// The configuration of the intake's tests and fuzz targets: `/coupon <campaign>`, one per
/// campaign and user; `/feedback <topic> <text>`, one per topic and user whatever the text;
/// `/refund <order>`, once per minute of repeats.
pub(super) const CONFIG: &str = r#"
[[bots]]
name = "shop"
token_env = "SHOP_TOKEN"
webhook_secret_env = "SHOP_SECRET"

[[actions]]
name = "coupon"
bot = "shop"
command = "coupon"
params = ["campaign"]
key = "{campaign}:{user_id}"
[actions.effector]
url = "http://127.0.0.1:9/coupons"
max_attempts = 3

[[actions]]
name = "feedback"
bot = "shop"
command = "feedback"
params = ["topic", "text"]
key = "{topic}:{user_id}"

[[actions]]
name = "refund"
bot = "shop"
command = "refund"
params = ["order"]
key = "{order}"
repeat_window_secs = 60
"#;

static RULES: LazyLock<Rules> = LazyLock::new(|| {
    let env = HashMap::from([("SHOP_TOKEN", "1:token"), ("SHOP_SECRET", "secret")]);
    let config = Config::parse(CONFIG, &|name| env.get(name).map(|v| (*v).to_owned()))
        .expect("the fuzzing configuration is valid");
    Rules::new(&config)
});

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_790_000_000, 0).expect("in range")
}

/// The intake decision for `update` (read from `raw`) given `snapshot`; a button's token stream,
/// which intake reads even on a first attempt, is read as never issued.
fn decide(update: &Update, raw: &[u8], mut snapshot: Snapshot) -> (Decided, Changes) {
    let arrival = Arrival {
        bot: BOT,
        update,
        raw,
        now: now(),
        token_seed: [0; 16],
    };
    loop {
        let mut changes = Changes::default();
        match decision::decide(&RULES, &arrival, &snapshot, &mut changes) {
            Ok(decided) => return (decided, changes),
            Err(Undecided::Unread(unread)) => {
                assert!(
                    unread.stream().as_str().starts_with("cb-"),
                    "only a button's token is read on a first attempt: {}",
                    unread.stream()
                );
                snapshot = snapshot.with(unread.stream().clone(), IssuedToken::default());
            }
            Err(Undecided::Rejected(rejection)) => {
                panic!("a fresh ledger refused an update: {rejection}")
            }
        }
    }
}

fn delivery(update_id: i64) -> StreamId {
    StreamId::new(delivery_stream(BOT, update_id).expect("a valid bot")).expect("a stream id")
}

/// Target `update_envelope`: a raw webhook body is read (see
/// [`opledger_telegram::fuzzing::update_envelope`]) and then recorded: a body that is not an
/// update is a quarantine note with its digest and size; an update is accepted by a fresh
/// ledger (never refused, which would answer Telegram 503 forever), its `UpdateReceived`
/// comes first and carries its id and digest, the decision is a pure function, and the same
/// bytes again are a duplicate while another body under the same id is a collision.
pub fn update_envelope(data: &[u8]) {
    let Some(update) = opledger_telegram::fuzzing::update_envelope(data) else {
        let quarantine = parse_update(data).expect_err("not an update");
        let mut changes = Changes::default();
        let reason = decision::quarantine(BOT, &quarantine, now(), &mut changes)
            .unwrap_or_else(|_| panic!("a quarantine is always recorded"));
        assert_eq!(reason, quarantine.reason.as_str());
        let stream = StreamId::new(quarantine_stream(BOT).expect("a valid bot")).expect("an id");
        let (_, events) = changes
            .staged::<QuarantineEvent>(&stream)
            .expect("the quarantine note");
        let [QuarantineEvent::BodyQuarantined(noted)] = events.as_slice() else {
            panic!("one note: {events:?}");
        };
        assert_eq!(
            (noted.digest.as_str(), noted.size),
            (quarantine.digest.as_str(), data.len() as u64)
        );
        return;
    };

    let (decided, changes) = decide(&update, data, Snapshot::assuming_new());
    let Decided::Accepted { route, .. } = &decided else {
        panic!("a fresh ledger sees no repeat: {decided:?}");
    };
    let stream = delivery(update.update_id);
    assert_eq!(
        changes.requests().first().map(|r| &r.stream),
        Some(&stream),
        "the delivery is staged first"
    );
    let (_, events) = changes
        .staged::<DeliveryEvent>(&stream)
        .expect("the delivery's events");
    let [DeliveryEvent::UpdateReceived(received)] = events.as_slice() else {
        panic!("one receipt, no raw body: {events:?}");
    };
    assert_eq!(
        (received.update_id, received.digest.as_str(), received.size),
        (update.update_id, update.digest.as_str(), data.len() as u64)
    );
    assert_eq!(received.kind, update.kind.as_str());
    assert_eq!(
        received.operation.as_ref().map(|o| o.operation_id),
        route_operation(route),
        "the receipt links the operation its route started or joined"
    );

    let (again, same) = decide(&update, data, Snapshot::assuming_new());
    assert_eq!(again, decided, "the decision is a pure function");
    assert_eq!(same.requests(), changes.requests());

    let recorded = || Snapshot::assuming_new().given::<Delivery>(stream.clone(), &events);
    let (repeat, _) = decide(&update, data, recorded());
    assert_eq!(repeat, Decided::Duplicate, "the same bytes again");
    let mut other = data.to_vec();
    other.push(b' ');
    let other_update = parse_update(&other).expect("trailing whitespace keeps the update");
    let (collision, _) = decide(&other_update, &other, recorded());
    assert_eq!(
        collision,
        Decided::Collision,
        "another body under the same id"
    );
}

fn route_operation(route: &Route) -> Option<OperationId> {
    match route {
        Route::Started(link) | Route::Joined(link) => Some(link.operation_id),
        _ => None,
    }
}

/// A private message from user 7 with `text`; an entity marks the command word when the text
/// starts with `/`, as Telegram's clients do.
fn message(text: &str) -> Vec<u8> {
    let word = text.split(char::is_whitespace).next().unwrap_or_default();
    let entities = if word.starts_with('/') {
        serde_json::json!([{ "type": "bot_command", "offset": 0, "length": word.encode_utf16().count() }])
    } else {
        serde_json::json!([])
    };
    serde_json::to_vec(&serde_json::json!({
        "update_id": 1,
        "message": {
            "message_id": 1,
            "date": now().timestamp(),
            "chat": { "id": 7, "type": "private" },
            "from": { "id": 7, "is_bot": false, "first_name": "T" },
            "text": text,
            "entities": entities,
        }
    }))
    .expect("JSON")
}

/// Where a message with `text` goes on a fresh ledger, and the operation it starts.
fn route_of(text: &str) -> (Route, Option<opledger_domain::operation::Received>) {
    let raw = message(text);
    let update = parse_update(&raw).expect("a message");
    let (decided, changes) = decide(&update, &raw, Snapshot::assuming_new());
    let Decided::Accepted { route, .. } = decided else {
        panic!("a fresh ledger sees no repeat: {decided:?}");
    };
    let received = match &route {
        Route::Started(link) => {
            let stream = StreamId::new(link.stream.clone()).expect("a stream id");
            let (_, events) = changes
                .staged::<OperationEvent>(&stream)
                .expect("the operation's events");
            let [OperationEvent::Received(received)] = events.as_slice() else {
                panic!("one receipt: {events:?}");
            };
            Some(received.clone())
        }
        _ => None,
    };
    (route, received)
}

/// Target `command`: the first byte and the text are read as
/// [`opledger_telegram::fuzzing::command`] does, then the text is sent as a message. Its route
/// follows its command (none: nothing; `/help`, `/start`, `/status`; an action's), an
/// operation's business key and fingerprint come from the command's arguments bound to the
/// action's params, and the command written in its normalized form goes to the same operation.
pub fn command(data: &[u8]) {
    let command = opledger_telegram::fuzzing::command(data);
    let text = String::from_utf8_lossy(data.get(1..).unwrap_or_default());
    let (route, received) = route_of(&text);
    let Some(command) = command else {
        assert_eq!(route, Route::Nothing, "no command, nowhere to go");
        return;
    };
    match (command.name.as_str(), &route) {
        ("help" | "start", Route::Help) | (_, Route::Status { .. } | Route::Usage { .. }) => {}
        (_, Route::Nothing) => {
            assert!(!["coupon", "feedback", "refund"].contains(&command.name.as_str()))
        }
        (name, Route::Started(link)) => {
            assert_eq!(link.action, name);
            let received = received.expect("a started operation's receipt");
            let action = RULES.action_for(BOT, name).expect("a configured action");
            let bound = decision::bind_params(&action.params, &command.args).expect("bound");
            assert_eq!(received.params, bound);
            assert_eq!(received.fingerprint, fingerprint(name, &bound));
            assert_eq!(
                received.operation_id,
                OperationId::new(name, &received.business_key)
            );
            assert_eq!(link.operation_id, received.operation_id);
        }
        (name, other) => panic!("/{name} on a fresh ledger cannot go to {other:?}"),
    }
    let (again, _) = route_of(&format!("/{}", command.normalized()));
    assert_eq!(
        again, route,
        "the normalized command goes where the command went"
    );
}
