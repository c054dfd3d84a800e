//! Text from users and from outside reaches operators' terminals escaped (issue 15 D7): a
//! business key holding an OSC title sequence, BEL and bidirectional overrides, recorded through
//! the real service, is printed by `opledger ops`, `timeline` and `events` as visible `\uXXXX`
//! escapes, in tables and in JSON Lines (which stay valid JSON with the same value).

use opledger_projections::operation_status::{self, Filter};
use serde_json::Value;

use crate::support::app::{
    Backend, COUPON, Ledger, TestApp, config, message_from, on_both_backends,
};
use crate::support::{opledger, stderr, stdout};

on_both_backends!(user_text_is_escaped_in_every_listing);

/// What a user typed after `/coupon`: a terminal title change, a bell, a CSI as one C1
/// character, a right-to-left override and an isolate.
const HOSTILE: &str = "\u{1b}]0;PWNED\u{7}\u{9b}2J\u{202e}gnp\u{2066}x\u{2069}";

/// No byte or character in `text` that a terminal would act on.
fn assert_inert(text: &str, what: &str) {
    let bad: Vec<char> = text
        .chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect();
    assert!(bad.is_empty(), "{what} prints {bad:?} raw: {text:?}");
}

async fn user_text_is_escaped_in_every_listing(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let app = TestApp::spawn(&ledger, &config(COUPON)).await;
    let body = message_from(1, 1_790_000_000, 42, &format!("/coupon {HOSTILE}"));
    assert_eq!(app.deliver(body).await.status(), 200);
    let rows = operation_status::list(
        app.store.reader(),
        &Filter {
            limit: 10,
            ..Filter::default()
        },
    )
    .await
    .expect("read operation_status");
    app.stop().await;
    let key = format!("{HOSTILE}:42");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].business_key, key,
        "the ledger keeps the text as typed"
    );
    let operation = rows[0].operation_id.clone();
    let visible = "\\u001b]0;PWNED\\u0007\\u009b2J\\u202egnp\\u2066x\\u2069:42";
    let url = ledger.url();

    for args in [&["ops"][..], &["timeline", &operation]] {
        let output = opledger(&url, args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        let text = stdout(&output);
        assert_inert(&text, &format!("{args:?}"));
        assert!(text.contains(visible), "{args:?}: {text}");
    }

    for args in [
        &["ops", "--json"][..],
        &["timeline", &operation, "--json"],
        &["events", "--json"],
    ] {
        let output = opledger(&url, args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        let text = stdout(&output);
        assert_inert(&text, &format!("{args:?}"));
        let lines: Vec<Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).expect("each line is JSON"))
            .collect();
        // Parsed back, some line holds the key exactly as typed.
        let quoted = serde_json::to_string(&key).expect("JSON");
        let holds_key = |line: &Value| line.to_string().contains(quoted.trim_matches('"'));
        assert!(lines.iter().any(holds_key), "{args:?}: {text}");
    }
    let ops: Value = serde_json::from_str(
        stdout(&opledger(&url, &["ops", "--json"]))
            .lines()
            .next()
            .expect("one operation"),
    )
    .expect("JSON");
    assert_eq!(ops["business_key"], key.as_str(), "the same value, escaped");

    // Errors quote what the operator typed or what the ledger holds: escaped as well.
    let output = opledger(&url, &["timeline", HOSTILE]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert_inert(&stderr(&output), "an error");
    assert!(
        stderr(&output).contains("\\u001b]0;PWNED"),
        "{}",
        stderr(&output)
    );
}
