//! Given/when/then table for the CallbackToken: issue once, consume once, record every refusal.

use opledger_domain::IssueRejection;
use opledger_domain::callback_token::{
    CallbackTokenCommand, CallbackTokenEvent, Click, TokenCancelled, TokenConsumed, TokenRejected,
    TokenRejection, TokenStatus, cancel_data, mint_token,
};
use opledger_domain::{CallbackToken, callback_stream};

use crate::fixtures::*;
use crate::harness::given;

fn consume(user_id: i64, update_id: i64) -> CallbackTokenCommand {
    CallbackTokenCommand::Consume { user_id, update_id }
}

fn rejected(reason: TokenRejection, user_id: i64, update_id: i64) -> CallbackTokenEvent {
    TokenRejected {
        reason,
        user_id,
        update_id,
    }
    .into()
}

fn cancel(user_id: i64, update_id: i64) -> CallbackTokenCommand {
    CallbackTokenCommand::Cancel { user_id, update_id }
}

fn cancelled(update_id: i64) -> CallbackTokenEvent {
    TokenCancelled {
        user_id: USER,
        update_id,
    }
    .into()
}

fn consumed(update_id: i64) -> CallbackTokenEvent {
    TokenConsumed {
        user_id: USER,
        update_id,
    }
    .into()
}

#[test]
fn a_token_is_issued_once() {
    let state = given::<CallbackToken>([])
        .when(CallbackTokenCommand::Issue(token_issued()), t(0))
        .then(vec![token_issued().into()]);
    assert_eq!(state.status, TokenStatus::Issued);
    given::<CallbackToken>([token_issued().into()])
        .when(CallbackTokenCommand::Issue(token_issued()), t(1))
        .then_reject(IssueRejection::AlreadyIssued { expires_at: t(600) });
}

#[test]
fn a_token_with_refused_clicks_is_not_issued() {
    given::<CallbackToken>([rejected(TokenRejection::NotIssued, USER, 1)])
        .when(CallbackTokenCommand::Issue(token_issued()), t(0))
        .then_reject(IssueRejection::NotFresh);
}

#[test]
fn malformed_issues_are_refused() {
    let mut bad_token = token_issued();
    bad_token.token = "has space".to_owned();
    let mut bad_action = token_issued();
    bad_action.action = "Coupon".to_owned();
    let cases = [
        (
            bad_token,
            t(0),
            "token must be 1 to 64 bytes from A-Z, a-z, 0-9, _ and -",
        ),
        (
            bad_action,
            t(0),
            "action must be 1 to 64 characters from a-z, 0-9 and _",
        ),
        (token_issued(), t(600), "expires_at must be after now"),
    ];
    for (issued, now, reason) in cases {
        given::<CallbackToken>([])
            .when(CallbackTokenCommand::Issue(issued), now)
            .then_reject(IssueRejection::InvalidCommand { reason });
    }
}

#[test]
fn the_first_click_of_its_user_before_expiry_consumes_it() {
    let state = given::<CallbackToken>([token_issued().into()])
        .when(consume(USER, 10), t(599))
        .then(vec![consumed(10)]);
    assert_eq!(state.status, TokenStatus::Consumed);
    assert_eq!(state.consumed_by_update, Some(10));
}

#[test]
fn every_refused_click_is_recorded() {
    let issued: CallbackTokenEvent = token_issued().into();
    let cases = [
        (
            vec![],
            consume(USER, 11),
            t(0),
            TokenRejection::NotIssued,
            USER,
        ),
        (
            vec![issued.clone(), consumed(10)],
            consume(USER, 11),
            t(10),
            TokenRejection::AlreadyConsumed,
            USER,
        ),
        (
            vec![issued.clone()],
            consume(7, 11),
            t(10),
            TokenRejection::WrongUser,
            7,
        ),
        (
            vec![issued.clone(), consumed(10)],
            consume(7, 11),
            t(10),
            TokenRejection::WrongUser,
            7,
        ),
        (
            vec![issued],
            consume(USER, 11),
            t(600),
            TokenRejection::Expired,
            USER,
        ),
    ];
    for (history, command, now, reason, user) in cases {
        let before = CallbackToken::replay(&history);
        let after = given::<CallbackToken>(history)
            .when(command, now)
            .then(vec![rejected(reason, user, 11)]);
        assert_eq!(
            after.status, before.status,
            "a refused click changes nothing"
        );
        assert_eq!(after.rejections, before.rejections + 1);
    }
}

#[test]
fn minted_tokens_fit_callback_data_and_name_a_stream() {
    let token = mint_token(&[0xff; 16]);
    assert_eq!(token, "t1_ffffffffffffffffffffffffffffffff");
    assert!(token.len() <= 64);
    assert_eq!(mint_token(&core::array::from_fn(|i| i as u8)), TOKEN);
    assert_eq!(
        callback_stream(&token).expect("valid"),
        format!("cb-{token}")
    );
}

#[test]
fn its_user_cancels_it_before_expiry_and_then_nothing_uses_it() {
    let state = given::<CallbackToken>([token_issued().into()])
        .when(cancel(USER, 10), t(599))
        .then(vec![cancelled(10)]);
    assert_eq!(state.status, TokenStatus::Cancelled);
    // A confirmation's *Confirm* after its *Cancel*, or a second *Cancel*: refused.
    for command in [consume(USER, 11), cancel(USER, 11)] {
        given::<CallbackToken>([token_issued().into(), cancelled(10)])
            .when(command, t(20))
            .then(vec![rejected(TokenRejection::Cancelled, USER, 11)]);
    }
}

#[test]
fn a_cancel_is_refused_like_any_click() {
    let issued: CallbackTokenEvent = token_issued().into();
    let cases = [
        (vec![], USER, t(0), TokenRejection::NotIssued),
        (vec![issued.clone()], 7, t(10), TokenRejection::WrongUser),
        (
            vec![issued.clone(), consumed(10)],
            USER,
            t(10),
            TokenRejection::AlreadyConsumed,
        ),
        (vec![issued], USER, t(600), TokenRejection::Expired),
    ];
    for (history, user, now, reason) in cases {
        let before = CallbackToken::replay(&history);
        let after = given::<CallbackToken>(history)
            .when(cancel(user, 11), now)
            .then(vec![rejected(reason, user, 11)]);
        assert_eq!(
            after.status, before.status,
            "a refused cancel changes nothing"
        );
    }
}

#[test]
fn a_click_is_read_from_its_callback_data() {
    let token = mint_token(&[0xab; 16]);
    let cancel_button = cancel_data(&token);
    assert!(
        cancel_button.len() <= 64,
        "fits callback_data: {cancel_button}"
    );
    assert_eq!(Click::read(&token), Some(Click::Use(&token)));
    assert_eq!(Click::read(&cancel_button), Some(Click::Cancel(&token)));
    assert_eq!(Click::read(&cancel_button).unwrap().token(), token);
    assert_eq!(
        Click::read(&cancel_button).unwrap().command(USER, 3),
        cancel(USER, 3)
    );
    for theirs in ["buy_42", "menu-cancel", ""] {
        assert_eq!(Click::read(theirs), None, "{theirs} is the bot's own");
    }
}
