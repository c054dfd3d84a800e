//! Replays the fuzz corpora (`fuzz/corpus/<target>/`) through the same functions the cargo-fuzz
//! targets call, so that every input the fuzzers kept, including the inputs that once found a
//! bug, is checked against the targets' invariants on stable, in every CI run.

use std::panic::{self, AssertUnwindSafe};
use std::path::Path;

fn replay(target: &str, body: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "{} holds the corpus of {target}",
        dir.display()
    );
    let failed: Vec<String> = files
        .iter()
        .filter(|file| {
            let data =
                std::fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
            panic::catch_unwind(AssertUnwindSafe(|| body(&data))).is_err()
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "{target}: {} of {} corpus inputs break an invariant (the panics above say which); \
         reproduce one with `cargo +nightly fuzz run {target} <file>` in fuzz/: {failed:#?}",
        failed.len(),
        files.len()
    );
}

#[test]
fn update_envelope_corpus() {
    replay(
        "update_envelope",
        opledger_server::intake::fuzzing::update_envelope,
    );
}

#[test]
fn command_corpus() {
    replay("command", opledger_server::intake::fuzzing::command);
}

#[test]
fn config_corpus() {
    replay("config", opledger_config::fuzzing::config);
}

#[test]
fn template_corpus() {
    replay("template", opledger_config::fuzzing::template);
}

#[test]
fn effector_answer_corpus() {
    replay("effector_answer", opledger_worker::fuzzing::effector_answer);
}

#[test]
fn bot_api_answer_corpus() {
    replay("bot_api_answer", opledger_telegram::fuzzing::bot_api_answer);
}
