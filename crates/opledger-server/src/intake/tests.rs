//! Given/when/then tables for the intake decision, without a store: given the streams' events,
//! when an update arrives, then these appends (expected version and events, in order) and this
//! route.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, TimeDelta, Utc};
use opledger_config::Config;
use opledger_domain::callback_token::{
    CallbackToken, CallbackTokenEvent, TokenCancelled, TokenConsumed, TokenIssued, TokenRejected,
    TokenRejection, cancel_data, mint_token,
};
use opledger_domain::delivery::{
    Delivery, DeliveryEvent, DuplicateDeliveryObserved, RawUpdateStored, UpdateIdCollision,
    UpdateReceived,
};
use opledger_domain::operation::{KeyConflictRecorded, OperationEvent, Received};
use opledger_domain::quarantine::QuarantineEvent;
use opledger_domain::repeat_guard::{CommandSeen, RepeatGuard, RepeatGuardEvent};
use opledger_domain::{
    DomainEvent, Operation, OperationId, OperationLink, callback_stream, fingerprint,
    repeat_guard_stream,
};
use opledger_ledger::{Changes, Snapshot, StreamState, Undecided};
use opledger_store::{ExpectedVersion, StreamId};
use opledger_telegram::parse_update;

use super::decision::{self, Arrival, Decided, IssuedToken, Rules, bind_params};
use super::fuzzing::CONFIG;
use super::{IntakeRejection, Route, Started, Submission};

const USER: i64 = 7;
/// The default `server.dedup_retention_hours`.
const RETENTION: TimeDelta = TimeDelta::hours(72);

fn config(extra: &str) -> Config {
    let env = HashMap::from([("SHOP_TOKEN", "1:token"), ("SHOP_SECRET", "secret")]);
    Config::parse(&format!("{extra}{CONFIG}"), &|name| {
        env.get(name).map(|v| (*v).to_owned())
    })
    .expect("the test configuration")
}

/// Seconds after the start of the tests' time.
fn t(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_790_000_000 + seconds, 0).expect("in range")
}

fn stream(id: &str) -> StreamId {
    StreamId::new(id).expect("a stream id")
}

fn delivery(update_id: i64) -> StreamId {
    stream(&format!("update-shop-{update_id}"))
}

/// A message from `USER` in a private chat with them, dated `date` (seconds after `t(0)`).
fn message(update_id: i64, date: i64, text: &str) -> Vec<u8> {
    let entities = match text.split_whitespace().next() {
        Some(command) if command.starts_with('/') => {
            serde_json::json!([{ "type": "bot_command", "offset": 0, "length": command.len() }])
        }
        _ => serde_json::json!([]),
    };
    serde_json::to_vec(&serde_json::json!({
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": t(date).timestamp(),
            "chat": { "id": USER, "type": "private" },
            "from": { "id": USER, "is_bot": false, "first_name": "Test" },
            "text": text,
            "entities": entities,
        }
    }))
    .expect("JSON")
}

/// A click by `user` on a button carrying `data`.
fn click(update_id: i64, user: i64, data: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "update_id": update_id,
        "callback_query": {
            "id": format!("cb{update_id}"),
            "from": { "id": user, "is_bot": false, "first_name": "Test" },
            "chat_instance": "1",
            "message": { "message_id": 1, "date": t(0).timestamp(), "chat": { "id": user, "type": "private" } },
            "data": data,
        }
    }))
    .expect("JSON")
}

const TOKEN: &str = "t1_00112233445566778899aabbccddeeff";

/// The random bytes every test arrival carries: a confirmation's token is minted from them.
const SEED: [u8; 16] = [0xc0; 16];

fn token_stream() -> StreamId {
    stream(&callback_stream(TOKEN).expect("a token"))
}

/// The spring coupon's token, issued for `USER` until `t(600)`.
fn issued() -> CallbackTokenEvent {
    TokenIssued {
        token: TOKEN.to_owned(),
        action: "coupon".to_owned(),
        operation_id: None,
        user_id: USER,
        chat_id: Some(USER),
        expires_at: t(600),
        payload: BTreeMap::from([("campaign".to_owned(), "spring".to_owned())]),
    }
    .into()
}

/// The first receipt of `body` at `at`, in `epoch`, leading to `operation`.
fn receipt(body: &[u8], at: i64, epoch: u32, operation: Option<OperationLink>) -> DeliveryEvent {
    let update = parse_update(body).expect("an update");
    UpdateReceived {
        bot: "shop".to_owned(),
        update_id: update.update_id,
        epoch,
        kind: update.kind.as_str().into_owned(),
        digest: update.digest,
        size: update.size as u64,
        chat_id: update.chat_id,
        user_id: update.user_id,
        message_date: update.message_date,
        received_at: t(at),
        operation,
        forward: false,
    }
    .into()
}

fn link(action: &str, key: &str, joined: bool) -> OperationLink {
    OperationLink {
        action: action.to_owned(),
        operation_id: OperationId::new(action, key),
        stream: format!("op-{action}-{key}"),
        joined,
    }
}

/// The request `body` makes of `action` under `key`.
fn request(action: &str, key: &str, params: &[(&str, &str)], body: &[u8]) -> Received {
    let update = parse_update(body).expect("an update");
    let params: BTreeMap<String, String> = params
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let config = config("");
    let action_config = config.actions.iter().find(|a| a.name == action).unwrap();
    Received {
        operation_id: OperationId::new(action, key),
        action: action.to_owned(),
        business_key: key.to_owned(),
        fingerprint: fingerprint(action, &params),
        params,
        bot: "shop".to_owned(),
        chat_id: update.chat_id,
        user_id: update.user_id,
        update_id: update.update_id,
        message_date: update.message_date,
        max_attempts: action_config
            .effector
            .as_ref()
            .map_or(1, |e| e.max_attempts),
    }
}

fn coupon(campaign: &str, body: &[u8]) -> Received {
    let key = format!("{campaign}:{USER}");
    request("coupon", &key, &[("campaign", campaign)], body)
}

fn guard_stream(text: &str) -> StreamId {
    stream(&repeat_guard_stream("shop", Some(USER), Some(USER), text).expect("a guard stream"))
}

/// The streams the decision is given.
struct Given {
    snapshot: Snapshot,
    config: Config,
}

/// A first attempt: every stream not given is taken as new (ADR 0006).
fn first_attempt() -> Given {
    Given {
        snapshot: Snapshot::assuming_new(),
        config: config(""),
    }
}

/// An attempt after a conflict: every stream is read, so a test gives each stream the
/// decision may ask for (empty when it does not exist); asking for another is a failure.
fn given() -> Given {
    Given {
        snapshot: Snapshot::new(),
        config: config(""),
    }
}

impl Given {
    fn stream<S: StreamState>(mut self, stream: &StreamId, events: &[S::Event]) -> Self {
        self.snapshot = self.snapshot.given::<S>(stream.clone(), events);
        self
    }

    fn with_config(mut self, extra: &str) -> Self {
        self.config = config(extra);
        self
    }

    /// The shop bot with a gateway forwarding `updates` (`all` or `unhandled`).
    fn with_gateway(mut self, updates: &str) -> Self {
        let env = HashMap::from([("SHOP_TOKEN", "1:token"), ("SHOP_SECRET", "secret")]);
        let text = CONFIG.replacen(
            "webhook_secret_env = \"SHOP_SECRET\"\n",
            &format!(
                "webhook_secret_env = \"SHOP_SECRET\"\n[bots.forward]\n\
                 url = \"http://127.0.0.1:8081/webhook\"\nupdates = \"{updates}\"\n"
            ),
            1,
        );
        self.config = Config::parse(&text, &|name| env.get(name).map(|v| (*v).to_owned()))
            .expect("the test configuration");
        self
    }

    /// Decides `body` arriving at `at`.
    fn when(self, body: &[u8], at: i64) -> Then {
        let update = parse_update(body).expect("an update");
        let arrival = Arrival {
            bot: "shop",
            update: &update,
            raw: body,
            now: t(at),
            token_seed: SEED,
        };
        let mut changes = Changes::default();
        let decided = decision::decide(
            &Rules::new(&self.config),
            &arrival,
            &self.snapshot,
            &mut changes,
        );
        Then { changes, decided }
    }
}

/// A decision, waiting to be checked.
struct Then {
    changes: Changes,
    decided: Result<Decided, Undecided<IntakeRejection>>,
}

impl Then {
    /// Asserts what was decided.
    fn decided(&self, expected: Decided) -> &Self {
        match &self.decided {
            Ok(decided) => assert_eq!(decided, &expected),
            Err(undecided) => panic!("undecided ({undecided:?}), expected {expected:?}"),
        }
        self
    }

    /// Asserts the update was accepted in `epoch` and went to `route`.
    fn routed(&self, epoch: u32, route: Route) -> &Self {
        self.decided(Decided::Accepted { epoch, route })
    }

    /// Asserts which streams were staged, in order.
    fn streams(&self, expected: &[&StreamId]) -> &Self {
        assert_eq!(self.changes.streams(), expected);
        self
    }

    /// Asserts what was staged on `stream`.
    fn staged<E: DomainEvent + PartialEq + std::fmt::Debug>(
        &self,
        stream: &StreamId,
        expected: ExpectedVersion,
        events: Vec<E>,
    ) -> &Self {
        assert_eq!(
            self.changes.staged::<E>(stream),
            Some((expected, events)),
            "staged on {stream}"
        );
        self
    }

    /// Asserts that the click of update 5 by `user` was refused for `reason`, recorded as a note
    /// on `token` (at any version), and went nowhere.
    fn refused_as_a_note(&self, token: &StreamId, reason: TokenRejection, user: i64) -> &Self {
        let name = serde_json::to_value(reason).expect("a reason");
        self.routed(
            1,
            Route::TokenRefused {
                reason: name.as_str().expect("a name").to_owned(),
            },
        )
        .streams(&[&delivery(5), token])
        .staged(
            token,
            ExpectedVersion::Any,
            vec![CallbackTokenEvent::from(TokenRejected {
                reason,
                user_id: user,
                update_id: 5,
            })],
        )
    }

    /// Asserts the attachments written with `stream`'s append: `(name, body)`.
    fn attaches(&self, stream: &StreamId, expected: &[(&str, &[u8])]) -> &Self {
        let request = self
            .changes
            .requests()
            .iter()
            .find(|r| &r.stream == stream)
            .expect("staged");
        let attached: Vec<(&str, &[u8])> = request
            .attach
            .iter()
            .map(|a| (a.name.as_str(), a.body.as_slice()))
            .collect();
        assert_eq!(attached, expected, "attached to {stream}");
        self
    }

    /// Asserts the decision asked for `stream` before it could decide.
    fn reads(&self, stream: &StreamId) {
        match &self.decided {
            Err(Undecided::Unread(unread)) => assert_eq!(unread.stream(), stream),
            other => panic!("expected a read of {stream}, got {other:?}"),
        }
    }
}

#[test]
fn a_message_without_a_command_records_its_delivery_and_goes_nowhere() {
    let body = message(1, 0, "hello");
    first_attempt()
        .when(&body, 1)
        .routed(1, Route::Nothing)
        .streams(&[&delivery(1)])
        .staged(
            &delivery(1),
            ExpectedVersion::NoStream,
            vec![receipt(&body, 1, 1, None)],
        );
}

#[test]
fn a_new_action_command_starts_its_operation_assuming_every_stream_new() {
    let body = message(1, 0, "/coupon spring");
    let op = stream("op-coupon-spring:7");
    let started = link("coupon", "spring:7", false);
    first_attempt()
        .when(&body, 1)
        .routed(1, Route::Started(started.clone()))
        .streams(&[&delivery(1), &op])
        .staged(
            &delivery(1),
            ExpectedVersion::NoStream,
            vec![receipt(&body, 1, 1, Some(started))],
        )
        .staged(
            &op,
            ExpectedVersion::NoStream,
            vec![OperationEvent::from(coupon("spring", &body))],
        );
}

#[test]
fn the_same_business_key_joins_its_operation_and_stages_nothing_on_it() {
    let first = message(1, 0, "/coupon spring");
    let again = message(2, 5, "/coupon spring");
    let op = stream("op-coupon-spring:7");
    let joined = link("coupon", "spring:7", true);
    given()
        .stream::<Delivery>(&delivery(2), &[])
        .stream::<Operation>(&op, &[coupon("spring", &first).into()])
        .when(&again, 6)
        .routed(1, Route::Joined(joined.clone()))
        .streams(&[&delivery(2)])
        .staged(
            &delivery(2),
            ExpectedVersion::NoStream,
            vec![receipt(&again, 6, 1, Some(joined))],
        );
}

#[test]
fn the_same_key_with_other_parameters_is_a_recorded_key_conflict() {
    let first = message(1, 0, "/feedback delivery too slow");
    let other = message(2, 5, "/feedback delivery lovely");
    let op = stream("op-feedback-delivery:7");
    let params = |text| [("topic", "delivery"), ("text", text)];
    let existing = request("feedback", "delivery:7", &params("too slow"), &first);
    let asked = request("feedback", "delivery:7", &params("lovely"), &other);
    given()
        .stream::<Delivery>(&delivery(2), &[])
        .stream::<Operation>(&op, &[existing.clone().into()])
        .when(&other, 6)
        .routed(
            1,
            Route::KeyConflict {
                operation_id: OperationId::new("feedback", "delivery:7"),
            },
        )
        .streams(&[&delivery(2), &op])
        .staged(
            &delivery(2),
            ExpectedVersion::NoStream,
            vec![receipt(&other, 6, 1, None)],
        )
        .staged(
            &op,
            ExpectedVersion::Exact(1),
            vec![OperationEvent::from(KeyConflictRecorded {
                update_id: 2,
                bot: "shop".to_owned(),
                fingerprint: asked.fingerprint,
                existing_fingerprint: existing.fingerprint,
            })],
        );
}

#[test]
fn a_command_without_its_parameters_gets_usage_and_starts_nothing() {
    let body = message(1, 0, "/coupon");
    first_attempt()
        .when(&body, 1)
        .routed(
            1,
            Route::Usage {
                action: "coupon".to_owned(),
            },
        )
        .streams(&[&delivery(1)]);
}

#[test]
fn help_start_and_status_are_answered_without_touching_any_other_stream() {
    let cases = [
        ("/help", Route::Help),
        ("/start", Route::Help),
        ("/status", Route::Status { operation_id: None }),
        (
            "/status abc",
            Route::Status {
                operation_id: Some("abc".to_owned()),
            },
        ),
    ];
    for (text, route) in cases {
        let body = message(1, 0, text);
        given()
            .stream::<Delivery>(&delivery(1), &[])
            .when(&body, 1)
            .routed(1, route)
            .streams(&[&delivery(1)]);
    }
}

#[test]
fn the_same_update_within_retention_is_only_noted_and_routed_nowhere() {
    let body = message(1, 0, "/coupon spring");
    let started = link("coupon", "spring:7", false);
    // Only the delivery is given: routing would ask for the operation's stream.
    given()
        .stream::<Delivery>(&delivery(1), &[receipt(&body, 1, 1, Some(started))])
        .when(&body, 30)
        .decided(Decided::Duplicate)
        .streams(&[&delivery(1)])
        .staged(
            &delivery(1),
            ExpectedVersion::Any,
            vec![DeliveryEvent::from(DuplicateDeliveryObserved {
                epoch: 1,
                digest: parse_update(&body).unwrap().digest,
                received_at: t(30),
            })],
        );
}

#[test]
fn another_body_under_a_recent_id_is_a_noted_collision() {
    let first = message(1, 0, "/coupon spring");
    let other = message(1, 0, "/coupon autumn");
    given()
        .stream::<Delivery>(&delivery(1), &[receipt(&first, 1, 1, None)])
        .when(&other, 45)
        .decided(Decided::Collision)
        .streams(&[&delivery(1)])
        .staged(
            &delivery(1),
            ExpectedVersion::Any,
            vec![DeliveryEvent::from(UpdateIdCollision {
                epoch: 1,
                first_digest: parse_update(&first).unwrap().digest,
                new_digest: parse_update(&other).unwrap().digest,
                received_at: t(45),
            })],
        );
}

#[test]
fn an_id_seen_again_after_retention_opens_a_new_epoch_and_is_routed_again() {
    let body = message(1, 0, "/coupon spring");
    let op = stream("op-coupon-spring:7");
    let later = RETENTION.num_seconds() + 1;
    let joined = link("coupon", "spring:7", true);
    given()
        .stream::<Delivery>(
            &delivery(1),
            &[receipt(
                &body,
                1,
                1,
                Some(link("coupon", "spring:7", false)),
            )],
        )
        .stream::<Operation>(&op, &[coupon("spring", &body).into()])
        .when(&body, later)
        .routed(2, Route::Joined(joined.clone()))
        .streams(&[&delivery(1)])
        .staged(
            &delivery(1),
            ExpectedVersion::Exact(1),
            vec![receipt(&body, later, 2, Some(joined))],
        );
}

#[test]
fn a_raw_body_is_staged_after_its_receipt_only_when_the_operator_opted_in() {
    let body = message(1, 0, "hello");
    first_attempt()
        .with_config("[server]\nstore_raw_updates = true\n")
        .when(&body, 1)
        .staged(
            &delivery(1),
            ExpectedVersion::NoStream,
            vec![
                receipt(&body, 1, 1, None),
                RawUpdateStored {
                    epoch: 1,
                    body: String::from_utf8(body.clone()).unwrap(),
                }
                .into(),
            ],
        );
}

#[test]
fn a_repeat_inside_the_window_joins_the_operation_of_the_guard_s_epoch() {
    let first = message(1, 0, "/refund A1");
    let again = message(2, 30, "/refund A1");
    let guard = guard_stream("refund A1");
    let op = stream("op-refund-A1#1");
    let joined = link("refund", "A1#1", true);
    let seen = |update_id, date| -> RepeatGuardEvent {
        CommandSeen {
            update_id,
            message_date: t(date),
            epoch: 1,
        }
        .into()
    };
    given()
        .stream::<Delivery>(&delivery(2), &[])
        .stream::<RepeatGuard>(&guard, &[seen(1, 0)])
        .stream::<Operation>(
            &op,
            &[request("refund", "A1#1", &[("order", "A1")], &first).into()],
        )
        .when(&again, 31)
        .routed(1, Route::Joined(joined.clone()))
        .streams(&[&delivery(2), &guard])
        .staged(
            &delivery(2),
            ExpectedVersion::NoStream,
            vec![receipt(&again, 31, 1, Some(joined))],
        )
        .staged(&guard, ExpectedVersion::Exact(1), vec![seen(2, 30)]);
}

#[test]
fn a_repeat_after_the_window_starts_the_next_epoch_s_operation() {
    let again = message(2, 61, "/refund A1");
    let guard = guard_stream("refund A1");
    let op = stream("op-refund-A1#2");
    let started = link("refund", "A1#2", false);
    given()
        .stream::<Delivery>(&delivery(2), &[])
        .stream::<RepeatGuard>(
            &guard,
            &[CommandSeen {
                update_id: 1,
                message_date: t(0),
                epoch: 1,
            }
            .into()],
        )
        .stream::<Operation>(&op, &[])
        .when(&again, 62)
        .routed(1, Route::Started(started.clone()))
        .streams(&[&delivery(2), &guard, &op])
        .staged(
            &guard,
            ExpectedVersion::Exact(1),
            vec![RepeatGuardEvent::from(CommandSeen {
                update_id: 2,
                message_date: t(61),
                epoch: 2,
            })],
        )
        .staged(
            &op,
            ExpectedVersion::NoStream,
            vec![OperationEvent::from(request(
                "refund",
                "A1#2",
                &[("order", "A1")],
                &again,
            ))],
        );
}

#[test]
fn a_click_consumes_its_token_and_starts_the_token_s_action() {
    let body = click(5, USER, TOKEN);
    let op = stream("op-coupon-spring:7");
    let started = link("coupon", "spring:7", false);
    first_attempt()
        .stream::<IssuedToken>(&token_stream(), &[issued()])
        .when(&body, 10)
        .routed(1, Route::Started(started.clone()))
        .streams(&[&delivery(5), &token_stream(), &op])
        .staged(
            &delivery(5),
            ExpectedVersion::NoStream,
            vec![receipt(&body, 10, 1, Some(started))],
        )
        .staged(
            &token_stream(),
            ExpectedVersion::Exact(1),
            vec![CallbackTokenEvent::from(TokenConsumed {
                user_id: USER,
                update_id: 5,
            })],
        )
        .staged(
            &op,
            ExpectedVersion::NoStream,
            vec![OperationEvent::from(coupon("spring", &body))],
        );
}

#[test]
fn a_token_s_stream_is_read_even_on_the_first_attempt() {
    first_attempt()
        .when(&click(5, USER, TOKEN), 10)
        .reads(&token_stream());
}

#[test]
fn after_a_conflict_the_delivery_is_read_before_anything_else() {
    given()
        .when(&message(1, 0, "/coupon spring"), 1)
        .reads(&delivery(1));
}

#[test]
fn clicks_no_later_event_can_save_are_refused_as_notes_at_any_version() {
    let consumed: CallbackTokenEvent = TokenConsumed {
        user_id: USER,
        update_id: 4,
    }
    .into();
    let cases = [
        (
            vec![issued(), consumed],
            USER,
            10,
            TokenRejection::AlreadyConsumed,
        ),
        (vec![issued()], USER + 1, 10, TokenRejection::WrongUser),
        (vec![issued()], USER, 600, TokenRejection::Expired),
    ];
    for (history, user, at, reason) in cases {
        let body = click(5, user, TOKEN);
        given()
            .stream::<Delivery>(&delivery(5), &[])
            .stream::<IssuedToken>(&token_stream(), &history)
            .when(&body, at)
            .refused_as_a_note(&token_stream(), reason, user);
    }
}

#[test]
fn a_click_on_a_token_not_issued_is_refused_at_the_version_read() {
    let refused = |update_id| -> CallbackTokenEvent {
        TokenRejected {
            reason: TokenRejection::NotIssued,
            user_id: USER,
            update_id,
        }
        .into()
    };
    let cases = [
        (vec![], ExpectedVersion::NoStream),
        (vec![refused(4)], ExpectedVersion::Exact(1)),
    ];
    for (history, expected) in cases {
        given()
            .stream::<Delivery>(&delivery(5), &[])
            .stream::<IssuedToken>(&token_stream(), &history)
            .when(&click(5, USER, TOKEN), 10)
            .routed(
                1,
                Route::TokenRefused {
                    reason: "not_issued".to_owned(),
                },
            )
            .staged(&token_stream(), expected, vec![refused(5)]);
    }
}

#[test]
fn callback_data_that_is_not_one_of_our_tokens_goes_nowhere() {
    for data in ["buy_42", "t1_not a token!"] {
        given()
            .stream::<Delivery>(&delivery(5), &[])
            .when(&click(5, USER, data), 10)
            .routed(1, Route::Nothing)
            .streams(&[&delivery(5)]);
    }
}

#[test]
fn a_token_is_issued_on_its_new_stream_for_a_configured_action_only() {
    let rules = Rules::new(&config(""));
    let CallbackTokenEvent::TokenIssued(token) = issued() else {
        unreachable!()
    };
    let mut changes = Changes::default();
    decision::issue(
        &rules,
        &token,
        t(0),
        &Snapshot::assuming_new(),
        &mut changes,
    )
    .expect("issued");
    assert_eq!(
        changes.staged::<CallbackTokenEvent>(&token_stream()),
        Some((ExpectedVersion::NoStream, vec![issued()]))
    );

    let unknown = TokenIssued {
        action: "lottery".to_owned(),
        ..token.clone()
    };
    let mut changes = Changes::default();
    let refused = decision::issue(
        &rules,
        &unknown,
        t(0),
        &Snapshot::assuming_new(),
        &mut changes,
    );
    assert!(matches!(
        refused,
        Err(Undecided::Rejected(IntakeRejection::UnknownAction(ref name))) if name == "lottery"
    ));
    assert!(changes.is_empty());

    // The same token again (read after a conflict) is the domain's refusal.
    let again = Snapshot::new().given::<CallbackToken>(token_stream(), &[issued()]);
    let refused = decision::issue(&rules, &token, t(0), &again, &mut Changes::default());
    assert!(matches!(
        refused,
        Err(Undecided::Rejected(IntakeRejection::Token(_)))
    ));
}

#[test]
fn a_body_that_is_not_an_update_is_noted_by_digest_and_size() {
    let quarantine = parse_update(b"not json").expect_err("not an update");
    let mut changes = Changes::default();
    let reason = decision::quarantine("shop", &quarantine, t(0), &mut changes).expect("noted");
    assert_eq!(reason, "not_json");
    let (expected, events) = changes
        .staged::<QuarantineEvent>(&stream("quarantine-shop"))
        .expect("staged");
    assert_eq!(expected, ExpectedVersion::Any);
    let [QuarantineEvent::BodyQuarantined(noted)] = events.as_slice() else {
        panic!("one body quarantined, got {events:?}");
    };
    assert_eq!((noted.size, noted.received_at), (8, t(0)));
    assert_eq!(noted.digest, quarantine.digest);
}

#[test]
fn arguments_bind_in_order_and_the_last_takes_the_rest() {
    let params = vec!["campaign".to_owned(), "note".to_owned()];
    let args: Vec<String> = ["spring", "hello", "there"].map(String::from).to_vec();
    let bound = bind_params(&params, &args).unwrap();
    assert_eq!(bound["campaign"], "spring");
    assert_eq!(bound["note"], "hello there");
    assert!(bind_params(&params, &args[..1]).is_none());
    assert!(bind_params(&[], &args).unwrap().is_empty());
}

/// A client's request for `/coupon <campaign>` for `USER` in their chat, caused by update 50.
fn submission(params: &[(&str, &str)]) -> Submission {
    Submission {
        client: "shop_handlers".to_owned(),
        bot: "shop".to_owned(),
        action: "coupon".to_owned(),
        params: params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        chat_id: Some(USER),
        user_id: Some(USER),
        update_id: 50,
    }
}

/// What the operation `submission` asks for is received with.
fn submitted(submission: &Submission, key: &str) -> Received {
    Received {
        operation_id: OperationId::new(&submission.action, key),
        action: submission.action.clone(),
        business_key: key.to_owned(),
        fingerprint: fingerprint(&submission.action, &submission.params),
        params: submission.params.clone(),
        bot: submission.bot.clone(),
        chat_id: submission.chat_id,
        user_id: submission.user_id,
        update_id: submission.update_id,
        message_date: None,
        max_attempts: 3,
    }
}

impl Given {
    /// Decides `submission` arriving at `at`.
    fn submits(
        self,
        submission: &Submission,
        at: i64,
    ) -> (Changes, Result<Started, Undecided<IntakeRejection>>) {
        let mut changes = Changes::default();
        let started = decision::submit(
            &Rules::new(&self.config),
            submission,
            t(at),
            &self.snapshot,
            &mut changes,
        );
        (changes, started)
    }
}

/// The refusal a submission got.
fn refusal(started: Result<Started, Undecided<IntakeRejection>>) -> String {
    match started {
        Err(Undecided::Rejected(rejection)) => rejection.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_submission_with_a_new_key_receives_its_operation_and_stages_nothing_else() {
    let asked = submission(&[("campaign", "spring")]);
    let (changes, started) = first_attempt().submits(&asked, 1);
    let key = format!("spring:{USER}");
    assert_eq!(
        started.ok(),
        Some(Started::New(link("coupon", &key, false)))
    );
    let op = stream(&format!("op-coupon-{key}"));
    assert_eq!(
        changes.streams(),
        [&op],
        "no delivery, no guard: only the operation"
    );
    assert_eq!(
        changes.staged::<OperationEvent>(&op),
        Some((
            ExpectedVersion::NoStream,
            vec![OperationEvent::from(submitted(&asked, &key))]
        ))
    );
    let metadata = changes.requests()[0].events[0].metadata.get();
    assert!(
        metadata.contains(r#""causation":{"kind":"client","client":"shop_handlers"}"#)
            && metadata.contains(r#""correlation":"update-shop-50""#),
        "caused by the client, correlated with the update it named: {metadata}"
    );
}

#[test]
fn a_submission_of_an_existing_key_joins_it_or_records_a_conflict() {
    let key = format!("spring:{USER}");
    let op = stream(&format!("op-coupon-{key}"));
    let existing = submitted(&submission(&[("campaign", "spring")]), &key);
    let again = submission(&[("campaign", "spring")]);
    let (changes, started) = given()
        .stream::<Operation>(&op, &[existing.clone().into()])
        .submits(&again, 2);
    assert_eq!(
        started.ok(),
        Some(Started::Joined(link("coupon", &key, true)))
    );
    assert!(changes.is_empty(), "a join appends nothing");

    // Another campaign under the same key: the key template ignores nothing here, so make
    // the existing operation's parameters differ instead.
    let mut other = existing.clone();
    other.params = BTreeMap::from([("campaign".to_owned(), "autumn".to_owned())]);
    other.fingerprint = fingerprint("coupon", &other.params);
    let (changes, started) = given()
        .stream::<Operation>(&op, &[other.clone().into()])
        .submits(&again, 2);
    let asked = fingerprint("coupon", &again.params);
    assert_eq!(
        started.ok(),
        Some(Started::KeyConflict {
            operation_id: OperationId::new("coupon", &key),
            fingerprint: asked.clone(),
            existing_fingerprint: other.fingerprint.clone(),
        })
    );
    assert_eq!(
        changes.staged::<OperationEvent>(&op),
        Some((
            ExpectedVersion::Exact(1),
            vec![OperationEvent::from(KeyConflictRecorded {
                update_id: 50,
                bot: "shop".to_owned(),
                fingerprint: asked,
                existing_fingerprint: other.fingerprint,
            })]
        ))
    );
}

#[test]
fn a_submission_that_does_not_fit_its_action_is_refused_and_stages_nothing() {
    let cases: Vec<(Submission, &str)> = vec![
        (
            Submission {
                action: "nope".to_owned(),
                ..submission(&[("campaign", "spring")])
            },
            "bot `shop` has no action named `nope`: use one of the actions configured for it",
        ),
        (
            submission(&[]),
            "the parameters do not fit action `coupon`: `campaign` is missing or empty",
        ),
        (
            submission(&[("campaign", "")]),
            "the parameters do not fit action `coupon`: `campaign` is missing or empty",
        ),
        (
            submission(&[("campaign", "spring"), ("colour", "red")]),
            "the parameters do not fit action `coupon`: `colour` is not one of its parameters \
             (campaign)",
        ),
        (
            Submission {
                user_id: None,
                ..submission(&[("campaign", "spring")])
            },
            "the parameters do not fit action `coupon`: its business key cannot be made: ",
        ),
    ];
    for (asked, expected) in cases {
        let (changes, started) = first_attempt().submits(&asked, 1);
        let refused = refusal(started);
        assert!(refused.starts_with(expected), "{refused}");
        assert!(changes.is_empty(), "nothing staged for {asked:?}");
    }
}

/// `/gift <campaign>`, one per campaign and user, asking first; it calls nothing out.
const GIFT: &str = r#"
[[actions]]
name = "gift"
bot = "shop"
command = "gift"
params = ["campaign"]
key = "{campaign}:{user_id}"
confirm = "Send a {campaign} gift ({operation_id})?"
confirm_expiry_secs = 300
"#;

/// The confirmation token every test's `/gift` is asked with.
fn gift_token() -> String {
    mint_token(&SEED)
}

fn gift_stream() -> StreamId {
    stream(&callback_stream(&gift_token()).expect("a token"))
}

/// What `/gift spring`, received at `at`, issues for `USER`.
fn gift_issued(at: i64) -> CallbackTokenEvent {
    TokenIssued {
        token: gift_token(),
        action: "gift".to_owned(),
        operation_id: Some(OperationId::new("gift", "spring:7")),
        user_id: USER,
        chat_id: Some(USER),
        expires_at: t(at + 300),
        payload: BTreeMap::from([("campaign".to_owned(), "spring".to_owned())]),
    }
    .into()
}

#[test]
fn a_command_that_asks_first_issues_its_token_and_starts_nothing() {
    let body = message(1, 0, "/gift spring");
    let asked = Route::Confirm {
        action: "gift".to_owned(),
        token: gift_token(),
        question: format!(
            "Send a spring gift ({})?",
            OperationId::new("gift", "spring:7")
        ),
    };
    // On the first attempt, and again after a conflict (every stream read, none there yet).
    for attempt in [
        first_attempt(),
        given()
            .stream::<Delivery>(&delivery(1), &[])
            .stream::<CallbackToken>(&gift_stream(), &[]),
    ] {
        attempt
            .with_config(GIFT)
            .when(&body, 1)
            .routed(1, asked.clone())
            .streams(&[&delivery(1), &gift_stream()])
            .staged(
                &delivery(1),
                ExpectedVersion::NoStream,
                vec![receipt(&body, 1, 1, None)],
            )
            .staged(
                &gift_stream(),
                ExpectedVersion::NoStream,
                vec![gift_issued(1)],
            );
    }
    assert!(gift_token().len() <= 64 && cancel_data(&gift_token()).len() <= 64);
}

#[test]
fn a_confirmation_s_malformed_command_is_answered_with_its_usage() {
    first_attempt()
        .with_config(GIFT)
        .when(&message(1, 0, "/gift"), 1)
        .routed(
            1,
            Route::Usage {
                action: "gift".to_owned(),
            },
        )
        .streams(&[&delivery(1)]);
}

#[test]
fn confirm_starts_the_action_as_the_command_would_have() {
    let body = click(5, USER, &gift_token());
    let op = stream("op-gift-spring:7");
    let started = link("gift", "spring:7", false);
    first_attempt()
        .with_config(GIFT)
        .stream::<IssuedToken>(&gift_stream(), &[gift_issued(0)])
        .when(&body, 10)
        .routed(1, Route::Started(started))
        .streams(&[&delivery(5), &gift_stream(), &op])
        .staged(
            &gift_stream(),
            ExpectedVersion::Exact(1),
            vec![CallbackTokenEvent::from(TokenConsumed {
                user_id: USER,
                update_id: 5,
            })],
        )
        .staged(
            &op,
            ExpectedVersion::NoStream,
            vec![OperationEvent::from(gift_request(&body))],
        );
    // An operation that exists already under the key is joined, as by the command.
    given()
        .with_config(GIFT)
        .stream::<Delivery>(&delivery(5), &[])
        .stream::<IssuedToken>(&gift_stream(), &[gift_issued(0)])
        .stream::<Operation>(&op, &[gift_request(&click(4, USER, &gift_token())).into()])
        .when(&body, 10)
        .routed(1, Route::Joined(link("gift", "spring:7", true)));
}

/// The request the *Confirm* click in `body` makes.
fn gift_request(body: &[u8]) -> Received {
    let update = parse_update(body).expect("an update");
    let params = BTreeMap::from([("campaign".to_owned(), "spring".to_owned())]);
    Received {
        operation_id: OperationId::new("gift", "spring:7"),
        action: "gift".to_owned(),
        business_key: "spring:7".to_owned(),
        fingerprint: fingerprint("gift", &params),
        params,
        bot: "shop".to_owned(),
        chat_id: update.chat_id,
        user_id: update.user_id,
        update_id: update.update_id,
        message_date: update.message_date,
        max_attempts: 1,
    }
}

#[test]
fn cancel_cancels_the_token_and_starts_nothing() {
    let body = click(5, USER, &cancel_data(&gift_token()));
    first_attempt()
        .with_config(GIFT)
        .stream::<IssuedToken>(&gift_stream(), &[gift_issued(0)])
        .when(&body, 10)
        .routed(1, Route::Cancelled)
        .streams(&[&delivery(5), &gift_stream()])
        .staged(
            &delivery(5),
            ExpectedVersion::NoStream,
            vec![receipt(&body, 10, 1, None)],
        )
        .staged(
            &gift_stream(),
            ExpectedVersion::Exact(1),
            vec![CallbackTokenEvent::from(TokenCancelled {
                user_id: USER,
                update_id: 5,
            })],
        );
}

#[test]
fn after_a_cancel_confirm_is_refused_and_another_user_cancels_nothing() {
    let cancelled: CallbackTokenEvent = TokenCancelled {
        user_id: USER,
        update_id: 4,
    }
    .into();
    let cases = [
        (
            vec![gift_issued(0), cancelled.clone()],
            USER,
            gift_token(),
            TokenRejection::Cancelled,
        ),
        (
            vec![gift_issued(0), cancelled],
            USER,
            cancel_data(&gift_token()),
            TokenRejection::Cancelled,
        ),
        (
            vec![gift_issued(0)],
            USER + 1,
            cancel_data(&gift_token()),
            TokenRejection::WrongUser,
        ),
    ];
    for (history, user, data, reason) in cases {
        given()
            .with_config(GIFT)
            .stream::<Delivery>(&delivery(5), &[])
            .stream::<IssuedToken>(&gift_stream(), &history)
            .when(&click(5, user, &data), 10)
            .refused_as_a_note(&gift_stream(), reason, user);
    }
}

/// The receipt of `body` to be forwarded to the bot's webhook.
fn forwarded_receipt(body: &[u8], at: i64, operation: Option<OperationLink>) -> DeliveryEvent {
    let DeliveryEvent::UpdateReceived(received) = receipt(body, at, 1, operation) else {
        unreachable!("a receipt")
    };
    UpdateReceived {
        forward: true,
        ..received
    }
    .into()
}

#[test]
fn behind_a_gateway_what_opledger_does_not_answer_is_forwarded_with_its_exact_bytes() {
    let body = message(1, 0, "hello");
    first_attempt()
        .with_gateway("unhandled")
        .when(&body, 1)
        .routed(1, Route::Nothing)
        .staged(
            &delivery(1),
            ExpectedVersion::NoStream,
            vec![forwarded_receipt(&body, 1, None)],
        )
        .attaches(&delivery(1), &[("raw:1", &body)]);
}

#[test]
fn behind_a_gateway_start_and_help_are_the_bot_s_own() {
    for text in ["/start", "/help"] {
        let body = message(1, 0, text);
        first_attempt()
            .with_gateway("unhandled")
            .when(&body, 1)
            .routed(1, Route::Nothing)
            .attaches(&delivery(1), &[("raw:1", &body)]);
    }
}

#[test]
fn unhandled_keeps_opledger_s_own_commands_and_all_forwards_them_too() {
    let body = message(1, 0, "/coupon spring");
    let link = link("coupon", "spring:7", false);
    first_attempt()
        .with_gateway("unhandled")
        .when(&body, 1)
        .routed(1, Route::Started(link.clone()))
        .staged(
            &delivery(1),
            ExpectedVersion::NoStream,
            vec![receipt(&body, 1, 1, Some(link.clone()))],
        )
        .attaches(&delivery(1), &[]);
    first_attempt()
        .with_gateway("all")
        .when(&body, 1)
        .routed(1, Route::Started(link.clone()))
        .staged(
            &delivery(1),
            ExpectedVersion::NoStream,
            vec![forwarded_receipt(&body, 1, Some(link))],
        )
        .attaches(&delivery(1), &[("raw:1", &body)]);
}

#[test]
fn a_repeat_behind_a_gateway_is_noted_and_never_forwarded_again() {
    let body = message(1, 0, "hello");
    given()
        .with_gateway("all")
        .stream::<Delivery>(&delivery(1), &[forwarded_receipt(&body, 1, None)])
        .when(&body, 5)
        .decided(Decided::Duplicate)
        .attaches(&delivery(1), &[]);
}
