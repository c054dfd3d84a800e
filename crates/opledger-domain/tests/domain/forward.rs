//! Given/when/then table for forwarding an update to the bot's webhook (the gateway): attempts
//! are claims, a failure schedules the next, a 2xx ends it (even a late one), giving up waits for
//! the age, and the answer's call is started once and finished once.

use chrono::TimeDelta;
use opledger_domain::delivery::{
    AnswerCallFailed, AnswerCallSent, AnswerCallStarted, AnswerStart, DeliveryCommand,
    DeliveryEvent, ForwardCommand, ForwardFailed, ForwardGivenUp, ForwardStarted, UpdateForwarded,
    UpdateReceived,
};
use opledger_domain::{Delivery, DeliveryRejection, ForwardRejection};

use crate::fixtures::*;
use crate::harness::given;

/// The first receipt, to be forwarded.
fn received() -> DeliveryEvent {
    let DeliveryEvent::UpdateReceived(received) = update_received(DIGEST_A, 0, 1) else {
        unreachable!()
    };
    UpdateReceived {
        forward: true,
        ..received
    }
    .into()
}

fn forward(command: ForwardCommand) -> DeliveryCommand {
    DeliveryCommand::Forward(command)
}

fn start(lease_until: i64) -> DeliveryCommand {
    forward(ForwardCommand::Start {
        forwarder: "fwd-1".to_owned(),
        lease_until: t(lease_until),
    })
}

fn started(attempt: u32, lease_until: i64) -> DeliveryEvent {
    ForwardStarted {
        epoch: 1,
        attempt,
        forwarder: "fwd-1".to_owned(),
        lease_until: t(lease_until),
    }
    .into()
}

fn failed(attempt: u32, retry_at: i64) -> DeliveryEvent {
    ForwardFailed {
        epoch: 1,
        attempt,
        status: Some(503),
        error: "the bot answered 503".to_owned(),
        retry_at: t(retry_at),
    }
    .into()
}

fn fail(attempt: u32, retry_at: i64) -> DeliveryCommand {
    forward(ForwardCommand::Fail {
        attempt,
        status: Some(503),
        error: "the bot answered 503".to_owned(),
        retry_at: t(retry_at),
    })
}

fn acknowledge(attempt: u32, answer: Option<AnswerStart>) -> DeliveryCommand {
    forward(ForwardCommand::Acknowledge {
        attempt,
        status: 200,
        elapsed_ms: 4,
        answer,
    })
}

fn forwarded(attempt: u32) -> DeliveryEvent {
    UpdateForwarded {
        epoch: 1,
        attempt,
        status: 200,
        elapsed_ms: 4,
    }
    .into()
}

fn rejected(rejection: ForwardRejection) -> DeliveryRejection {
    DeliveryRejection::Forward(rejection)
}

#[test]
fn the_first_attempt_is_a_claim() {
    let state = given::<Delivery>([received()])
        .when(start(15), t(1))
        .then(vec![started(1, 15)]);
    assert_eq!(state.forwarding.in_flight, Some((1, t(15))));
}

#[test]
fn a_second_forwarder_is_refused_while_the_lease_lives() {
    given::<Delivery>([received(), started(1, 15)])
        .when(start(20), t(5))
        .then_reject(rejected(ForwardRejection::InFlight {
            attempt: 1,
            lease_until: t(15),
        }));
}

#[test]
fn an_expired_lease_lets_the_next_attempt_start() {
    given::<Delivery>([received(), started(1, 15)])
        .when(start(40), t(16))
        .then(vec![started(2, 40)]);
}

#[test]
fn a_failure_schedules_the_next_attempt_and_nothing_starts_before_it() {
    given::<Delivery>([received(), started(1, 15)])
        .when(fail(1, 10), t(2))
        .then(vec![failed(1, 10)]);
    given::<Delivery>([received(), started(1, 15), failed(1, 10)])
        .when(start(30), t(9))
        .then_reject(rejected(ForwardRejection::NotDue { retry_at: t(10) }));
    given::<Delivery>([received(), started(1, 15), failed(1, 10)])
        .when(start(30), t(10))
        .then(vec![started(2, 30)]);
}

#[test]
fn only_the_attempt_in_flight_can_fail() {
    given::<Delivery>([received(), started(1, 15), started(2, 40)])
        .when(fail(1, 50), t(20))
        .then_reject(rejected(ForwardRejection::NoSuchAttempt { attempt: 1 }));
}

#[test]
fn a_late_acknowledgement_of_an_earlier_attempt_still_ends_it() {
    let state = given::<Delivery>([received(), started(1, 15), started(2, 40)])
        .when(acknowledge(1, None), t(20))
        .then(vec![forwarded(1)]);
    assert!(state.forwarding.done);
    given::<Delivery>([received(), started(1, 15), forwarded(1)])
        .when(start(60), t(30))
        .then_reject(rejected(ForwardRejection::Done));
    given::<Delivery>([received(), started(1, 15), forwarded(1)])
        .when(acknowledge(1, None), t(30))
        .then_reject(rejected(ForwardRejection::Done));
}

#[test]
fn an_update_not_to_be_forwarded_is_never_started() {
    given::<Delivery>([update_received(DIGEST_A, 0, 1)])
        .when(start(15), t(1))
        .then_reject(rejected(ForwardRejection::NotForwarded));
    given::<Delivery>([])
        .when(start(15), t(1))
        .then_reject(rejected(ForwardRejection::NotForwarded));
}

#[test]
fn giving_up_waits_for_the_age_and_for_the_attempt_in_flight() {
    let give_up = || {
        forward(ForwardCommand::GiveUp {
            max_age: TimeDelta::seconds(60),
        })
    };
    given::<Delivery>([received(), started(1, 15), failed(1, 20)])
        .when(give_up(), t(59))
        .then_reject(rejected(ForwardRejection::NotOldEnough { since: t(0) }));
    given::<Delivery>([received(), started(1, 90)])
        .when(give_up(), t(61))
        .then_reject(rejected(ForwardRejection::InFlight {
            attempt: 1,
            lease_until: t(90),
        }));
    let state = given::<Delivery>([received(), started(1, 15), failed(1, 20)])
        .when(give_up(), t(60))
        .then(vec![
            ForwardGivenUp {
                epoch: 1,
                attempts: 1,
                reason: "the bot did not acknowledge it within 0.02 h of its receipt (1 attempts)"
                    .to_owned(),
            }
            .into(),
        ]);
    assert!(state.forwarding.done);
}

#[test]
fn the_answers_call_starts_with_the_acknowledgement_and_ends_once() {
    let answer = AnswerStart {
        method: "sendMessage".to_owned(),
        digest: DIGEST_B.to_owned(),
        lease_until: t(70),
    };
    let call_started: DeliveryEvent = AnswerCallStarted {
        epoch: 1,
        method: "sendMessage".to_owned(),
        digest: DIGEST_B.to_owned(),
        lease_until: t(70),
    }
    .into();
    given::<Delivery>([received(), started(1, 15)])
        .when(acknowledge(1, Some(answer)), t(10))
        .then(vec![forwarded(1), call_started.clone()]);
    let after = [received(), started(1, 15), forwarded(1), call_started];
    given::<Delivery>(after.clone())
        .when(
            forward(ForwardCommand::AnswerSent {
                message_id: Some(77),
            }),
            t(11),
        )
        .then(vec![
            AnswerCallSent {
                epoch: 1,
                method: "sendMessage".to_owned(),
                message_id: Some(77),
            }
            .into(),
        ]);
    let done: DeliveryEvent = AnswerCallFailed {
        epoch: 1,
        method: "sendMessage".to_owned(),
        error: "unknown".to_owned(),
        known: false,
    }
    .into();
    let mut finished = after.to_vec();
    finished.push(done);
    given::<Delivery>(finished)
        .when(
            forward(ForwardCommand::AnswerSent { message_id: None }),
            t(80),
        )
        .then_reject(rejected(ForwardRejection::NoAnswerInFlight));
}

#[test]
fn a_new_epoch_forwards_afresh() {
    let mut second = match update_received(DIGEST_B, 8 * 24 * 3_600, 2) {
        DeliveryEvent::UpdateReceived(e) => e,
        _ => unreachable!(),
    };
    second.forward = true;
    let state = given::<Delivery>([received(), started(1, 15), forwarded(1), second.into()])
        .when(start(8 * 24 * 3_600 + 15), t(8 * 24 * 3_600 + 1))
        .then(vec![
            ForwardStarted {
                epoch: 2,
                attempt: 1,
                forwarder: "fwd-1".to_owned(),
                lease_until: t(8 * 24 * 3_600 + 15),
            }
            .into(),
        ]);
    assert_eq!(state.forwarding.attempts, 1);
}
