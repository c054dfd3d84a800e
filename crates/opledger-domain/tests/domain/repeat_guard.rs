//! Given/when/then table of the RepeatGuard: which epoch (and so which operation) a repeated
//! command belongs to, by the message's own date.

use chrono::TimeDelta;
use opledger_domain::repeat_guard::{
    CommandSeen, RepeatGuard, RepeatGuardCommand, RepeatGuardEvent,
};
use opledger_domain::{RepeatGuardRejection, repeat_guard_stream};

use crate::fixtures::t;
use crate::harness::given;

fn see(update_id: i64, date_secs: i64) -> RepeatGuardCommand {
    RepeatGuardCommand::See {
        update_id,
        message_date: t(date_secs),
        window: TimeDelta::seconds(30),
    }
}

fn seen(update_id: i64, date_secs: i64, epoch: u32) -> RepeatGuardEvent {
    CommandSeen {
        update_id,
        message_date: t(date_secs),
        epoch,
    }
    .into()
}

#[test]
fn the_first_command_opens_epoch_1() {
    let state = given::<RepeatGuard>([])
        .when(see(1, 0), t(100))
        .then(vec![seen(1, 0, 1)]);
    assert_eq!(state.epoch, 1);
    assert_eq!(state.last_seen, Some(t(0)));
}

#[test]
fn a_repeat_within_the_window_joins_the_epoch_and_slides_it() {
    let state = given::<RepeatGuard>([seen(1, 0, 1)])
        .when(see(2, 30), t(999))
        .then(vec![seen(2, 30, 1)]);
    assert_eq!(state.last_seen, Some(t(30)));
    // The window now ends at 60: a repeat at 55 still joins although 55 s passed since the first.
    given::<RepeatGuard>([seen(1, 0, 1), seen(2, 30, 1)])
        .when(see(3, 55), t(0))
        .then(vec![seen(3, 55, 1)]);
}

#[test]
fn a_command_after_the_window_opens_the_next_epoch() {
    given::<RepeatGuard>([seen(1, 0, 1)])
        .when(see(2, 31), t(0))
        .then(vec![seen(2, 31, 2)]);
}

#[test]
fn a_late_update_from_the_past_joins_the_current_epoch() {
    let state = given::<RepeatGuard>([seen(1, 0, 1), seen(2, 100, 2)])
        .when(see(3, 10), t(0))
        .then(vec![seen(3, 10, 2)]);
    assert_eq!(
        state.last_seen,
        Some(t(100)),
        "the past does not move the window back"
    );
}

#[test]
fn the_receipt_time_does_not_matter() {
    // Same message dates, wildly different `now`: same decision.
    for now in [t(-1000), t(0), t(1_000_000)] {
        given::<RepeatGuard>([seen(1, 0, 1)])
            .when(see(2, 20), now)
            .then(vec![seen(2, 20, 1)]);
    }
}

#[test]
fn a_window_must_be_positive() {
    given::<RepeatGuard>([])
        .when(
            RepeatGuardCommand::See {
                update_id: 1,
                message_date: t(0),
                window: TimeDelta::zero(),
            },
            t(0),
        )
        .then_reject(RepeatGuardRejection::InvalidCommand {
            reason: "window must be positive",
        });
}

#[test]
fn guard_streams_are_deterministic_and_bounded() {
    let a = repeat_guard_stream("shop", Some(-100_123), Some(42), "coupon spring").unwrap();
    assert_eq!(a, "recent-shop--100123-42-coupon spring");
    assert_eq!(
        repeat_guard_stream("shop", None, Some(42), "coupon spring").unwrap(),
        "recent-shop---42-coupon spring"
    );
    let long = "x".repeat(500);
    let b = repeat_guard_stream("shop", Some(i64::MIN), Some(i64::MIN), &long).unwrap();
    assert!(b.len() <= 200, "{}", b.len());
    assert_eq!(
        b,
        repeat_guard_stream("shop", Some(i64::MIN), Some(i64::MIN), &long).unwrap()
    );
    assert_ne!(
        b,
        repeat_guard_stream("shop", Some(i64::MIN), Some(i64::MIN), &format!("{long}y")).unwrap()
    );
    assert!(repeat_guard_stream("Shop", None, None, "c").is_err());
}
