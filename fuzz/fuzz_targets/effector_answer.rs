//! Fuzz target `effector_answer`: its body and invariants are
//! `opledger_worker::fuzzing::effector_answer`, which the corpus replay tests run too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| opledger_worker::fuzzing::effector_answer(data));
