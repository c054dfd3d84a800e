//! Stream ids, operation ids and fingerprints: deterministic, bounded, unambiguous.

use std::collections::BTreeMap;

use opledger_domain::ids::{MAX_OPERATION_STREAM_LEN, validate_name};
use opledger_domain::{
    IdError, NameKind, OperationId, callback_stream, delivery_stream, fingerprint, operation_stream,
};
use proptest::prelude::*;

#[test]
fn stream_ids_have_their_documented_shape() {
    assert_eq!(
        delivery_stream("shop", 9_007_199_254_740_993).expect("valid"),
        "update-shop-9007199254740993"
    );
    assert_eq!(
        operation_stream("coupon", "spring:42:welcome").expect("valid"),
        "op-coupon-spring:42:welcome"
    );
    assert_eq!(callback_stream("t1_ab-C").expect("valid"), "cb-t1_ab-C");
}

#[test]
fn names_that_could_break_a_stream_id_are_refused() {
    for name in [
        "",
        "Shop",
        "shop-bot",
        "shop bot",
        "магазин",
        &"a".repeat(65),
    ] {
        assert_eq!(
            delivery_stream(name, 1),
            Err(IdError::InvalidName {
                kind: NameKind::Bot,
                name: name.to_owned()
            })
        );
        assert!(validate_name(NameKind::Action, name).is_err());
    }
    assert!(validate_name(NameKind::Action, &"a".repeat(64)).is_ok());
    assert_eq!(
        operation_stream("coupon", ""),
        Err(IdError::EmptyBusinessKey)
    );
    for token in ["", "a b", "a/b", "a+b", &"a".repeat(65)] {
        assert!(
            matches!(callback_stream(token), Err(IdError::InvalidToken { .. })),
            "{token:?}"
        );
    }
}

#[test]
fn the_operation_id_is_pinned() {
    // Changing the namespace or the name encoding would give every existing operation a new
    // idempotency key: this value must never change.
    let id = OperationId::new("coupon", "spring:42:welcome");
    assert_eq!(id.to_string(), "f4341268-d74f-519b-9ec2-301febce0b26");
    assert_eq!(id, OperationId::new("coupon", "spring:42:welcome"));
    assert_ne!(id, OperationId::new("coupon", "spring:42:welcome "));
    // Valid action names hold no NUL, so the separator keeps action and key apart.
    assert_ne!(OperationId::new("ab", "c"), OperationId::new("a", "bc"));
    assert_eq!(
        serde_json::to_string(&id).expect("serializes"),
        format!("\"{id}\"")
    );
}

#[test]
fn the_fingerprint_is_pinned_and_unambiguous() {
    let params = BTreeMap::from([("campaign".to_owned(), "spring".to_owned())]);
    assert_eq!(
        fingerprint("coupon", &params),
        "b90a905902ef09af199ca3c28b2bf79319af2b07c3daf7711ed02b9a5b2cc2b1"
    );
    let split = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
    assert_ne!(
        fingerprint("a", &split("bc", "d")),
        fingerprint("a", &split("b", "cd"))
    );
    assert_ne!(
        fingerprint("ab", &split("c", "d")),
        fingerprint("a", &split("bc", "d"))
    );
    assert_ne!(
        fingerprint("a", &BTreeMap::new()),
        fingerprint("a", &split("", ""))
    );
}

#[test]
fn long_keys_are_hashed_with_a_readable_prefix() {
    let long = format!("{}{}", "k".repeat(300), "tail-1");
    let other = format!("{}{}", "k".repeat(300), "tail-2");
    let stream = operation_stream("coupon", &long).expect("valid");
    assert!(stream.len() <= MAX_OPERATION_STREAM_LEN);
    assert!(stream.starts_with("op-coupon-kkkk"));
    let (_, hash) = stream.rsplit_once('~').expect("hashed");
    assert_eq!(hash.len(), 32);
    assert_ne!(stream, operation_stream("coupon", &other).expect("valid"));
}

#[test]
fn keys_with_control_characters_or_the_marker_are_hashed() {
    let stream = operation_stream("coupon", "line\nbreak").expect("valid");
    assert!(stream.starts_with("op-coupon-linebreak~"), "{stream}");
    assert!(!stream.chars().any(char::is_control));
    let marked = operation_stream("coupon", "a~b").expect("valid");
    assert!(marked.starts_with("op-coupon-ab~"), "{marked}");
    assert_ne!(marked, operation_stream("coupon", "ab").expect("valid"));
}

#[test]
fn a_multibyte_prefix_is_cut_at_a_character_boundary() {
    let stream = operation_stream("coupon", &"é".repeat(200)).expect("valid");
    assert!(stream.len() <= MAX_OPERATION_STREAM_LEN);
    assert!(stream.contains('~'));
}

proptest! {
    #[test]
    fn operation_streams_are_deterministic_and_bounded(key in "\\PC{1,300}|[\\x00-\\x7f]{1,300}") {
        let first = operation_stream("coupon", &key).expect("valid");
        prop_assert_eq!(&first, &operation_stream("coupon", &key).expect("valid"));
        prop_assert!(first.len() <= MAX_OPERATION_STREAM_LEN);
        prop_assert!(!first.chars().any(char::is_control));
        prop_assert!(first.starts_with("op-coupon-"));
    }

    #[test]
    fn different_keys_sharing_a_long_prefix_never_share_a_stream(
        prefix in "[a-z:]{190,260}",
        a in "[a-z0-9]{1,8}",
        b in "[a-z0-9]{1,8}",
    ) {
        prop_assume!(a != b);
        let left = operation_stream("coupon", &format!("{prefix}{a}")).expect("valid");
        let right = operation_stream("coupon", &format!("{prefix}{b}")).expect("valid");
        prop_assert_ne!(left, right);
    }
}
