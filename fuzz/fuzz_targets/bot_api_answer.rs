//! Fuzz target `bot_api_answer`: its body and invariants are
//! `opledger_telegram::fuzzing::bot_api_answer`, which the corpus replay tests run too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| opledger_telegram::fuzzing::bot_api_answer(data));
