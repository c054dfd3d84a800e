//! Given/when/then table for the Delivery: first receipt, duplicate, collision, new epoch.

use chrono::TimeDelta;
use opledger_domain::delivery::{
    DeliveryCommand, DeliveryEvent, DuplicateDeliveryObserved, RawUpdateStored, UpdateIdCollision,
};
use opledger_domain::{Delivery, DeliveryRejection};

use crate::fixtures::*;
use crate::harness::given;

const WEEK: i64 = 7 * 24 * 3_600;

#[test]
fn the_first_arrival_opens_epoch_1() {
    let state = given::<Delivery>([])
        .when(record(DIGEST_A, 0), t(0))
        .then(vec![update_received(DIGEST_A, 0, 1)]);
    assert_eq!(state.epoch, 1);
    assert_eq!(state.first_received_at, Some(t(0)));
}

#[test]
fn the_same_body_within_the_window_is_a_duplicate() {
    let state = given::<Delivery>([update_received(DIGEST_A, 0, 1)])
        .when(record(DIGEST_A, 30), t(30))
        .then(vec![
            DuplicateDeliveryObserved {
                epoch: 1,
                digest: DIGEST_A.to_owned(),
                received_at: t(30),
            }
            .into(),
        ]);
    assert_eq!((state.epoch, state.duplicates, state.collisions), (1, 1, 0));
}

#[test]
fn a_duplicate_just_inside_the_window_is_still_a_duplicate() {
    given::<Delivery>([update_received(DIGEST_A, 0, 1)])
        .when(record(DIGEST_A, WEEK - 1), t(WEEK - 1))
        .then(vec![
            DuplicateDeliveryObserved {
                epoch: 1,
                digest: DIGEST_A.to_owned(),
                received_at: t(WEEK - 1),
            }
            .into(),
        ]);
}

#[test]
fn another_body_within_the_window_is_a_collision() {
    let state = given::<Delivery>([update_received(DIGEST_A, 0, 1)])
        .when(record(DIGEST_B, 45), t(45))
        .then(vec![
            UpdateIdCollision {
                epoch: 1,
                first_digest: DIGEST_A.to_owned(),
                new_digest: DIGEST_B.to_owned(),
                received_at: t(45),
            }
            .into(),
        ]);
    assert_eq!((state.digest.as_str(), state.collisions), (DIGEST_A, 1));
}

#[test]
fn an_id_seen_again_after_the_window_opens_the_next_epoch() {
    let state = given::<Delivery>([
        update_received(DIGEST_A, 0, 1),
        DuplicateDeliveryObserved {
            epoch: 1,
            digest: DIGEST_A.to_owned(),
            received_at: t(30),
        }
        .into(),
    ])
    .when(record(DIGEST_B, WEEK), t(WEEK))
    .then(vec![update_received(DIGEST_B, WEEK, 2)]);
    assert_eq!(state.epoch, 2);
    assert_eq!(state.digest, DIGEST_B);
    assert_eq!(state.first_received_at, Some(t(WEEK)));
}

#[test]
fn a_clock_behind_the_first_receipt_counts_as_inside_the_window() {
    given::<Delivery>([update_received(DIGEST_A, 100, 1)])
        .when(record(DIGEST_A, 90), t(90))
        .then(vec![
            DuplicateDeliveryObserved {
                epoch: 1,
                digest: DIGEST_A.to_owned(),
                received_at: t(90),
            }
            .into(),
        ]);
}

#[test]
fn malformed_arrivals_are_refused() {
    let with = |edit: fn(&mut DeliveryCommand)| {
        let mut command = record(DIGEST_A, 0);
        edit(&mut command);
        command
    };
    let cases: [(DeliveryCommand, &str); 4] = [
        (
            with(|c| {
                if let DeliveryCommand::RecordUpdate { bot, .. } = c {
                    *bot = "Shop Bot".to_owned();
                }
            }),
            "bot must be 1 to 64 characters from a-z, 0-9 and _",
        ),
        (
            with(|c| {
                if let DeliveryCommand::RecordUpdate { kind, .. } = c {
                    kind.clear();
                }
            }),
            "kind must not be empty",
        ),
        (
            with(|c| {
                if let DeliveryCommand::RecordUpdate { digest, .. } = c {
                    digest.clear();
                }
            }),
            "digest must not be empty",
        ),
        (
            with(|c| {
                if let DeliveryCommand::RecordUpdate { retention, .. } = c {
                    *retention = TimeDelta::zero();
                }
            }),
            "retention must be positive",
        ),
    ];
    for (command, reason) in cases {
        given::<Delivery>([])
            .when(command, t(0))
            .then_reject(DeliveryRejection::InvalidCommand { reason });
    }
}

#[test]
fn a_raw_body_is_kept_only_when_asked_for() {
    let mut command = record(DIGEST_A, 0);
    let DeliveryCommand::RecordUpdate { raw_body, .. } = &mut command else {
        unreachable!("a record")
    };
    *raw_body = Some(r#"{"update_id":1}"#.to_owned());
    given::<Delivery>([]).when(command, t(0)).then(vec![
        update_received(DIGEST_A, 0, 1),
        RawUpdateStored {
            epoch: 1,
            body: r#"{"update_id":1}"#.to_owned(),
        }
        .into(),
    ]);
    // A duplicate never stores the body again.
    let mut repeat = record(DIGEST_A, 10);
    let DeliveryCommand::RecordUpdate { raw_body, .. } = &mut repeat else {
        unreachable!("a record")
    };
    *raw_body = Some(r#"{"update_id":1}"#.to_owned());
    let (_, result) = given::<Delivery>([update_received(DIGEST_A, 0, 1)])
        .when(repeat, t(10))
        .result();
    assert!(matches!(
        result.unwrap().as_slice(),
        [DeliveryEvent::DuplicateDeliveryObserved(_)]
    ));
}

#[test]
fn an_arrival_repeats_the_epoch_only_within_the_window_of_its_first_receipt() {
    let retention = TimeDelta::seconds(WEEK);
    let never = Delivery::default();
    assert!(!never.repeats(t(0), retention), "nothing to repeat");
    let seen = Delivery::replay(&[update_received(DIGEST_A, 0, 1)]);
    assert!(seen.repeats(t(0), retention));
    assert!(seen.repeats(t(WEEK - 1), retention));
    assert!(
        seen.repeats(t(-10), retention),
        "a clock behind counts as inside"
    );
    assert!(
        !seen.repeats(t(WEEK), retention),
        "the window is open at its end"
    );
    // A duplicate does not move the window: it is measured from the first receipt.
    let repeated = Delivery::replay(&[
        update_received(DIGEST_A, 0, 1),
        DuplicateDeliveryObserved {
            epoch: 1,
            digest: DIGEST_A.to_owned(),
            received_at: t(WEEK - 1),
        }
        .into(),
    ]);
    assert!(!repeated.repeats(t(WEEK), retention));
}
