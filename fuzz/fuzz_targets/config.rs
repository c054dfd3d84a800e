//! Fuzz target `config`: its body and invariants are `opledger_config::fuzzing::config`, which the
//! corpus replay tests run too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| opledger_config::fuzzing::config(data));
