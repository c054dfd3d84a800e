//! Fuzz target `update_envelope`: its body and invariants are
//! `opledger_server::intake::fuzzing::update_envelope`, which the corpus replay tests run too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| opledger_server::intake::fuzzing::update_envelope(data));
