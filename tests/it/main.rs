//! opledger's black-box tests, in one test binary: the event store conformance suite per backend,
//! crash tests with real child processes, the `opledger` command line, and house-style checks.

mod aiogram;
mod api;
mod audit;
mod buttons;
mod cli;
mod confirmations;
mod conformance;
mod crash;
mod demo;
mod echoed_secrets;
mod edge;
mod fixtures;
mod fuzz_corpus;
mod gateway;
mod hostile_text;
mod intake;
mod ledger_file;
mod operations_api;
mod polling;
mod postgres;
mod projections;
mod read_commands;
mod read_models;
mod reconcile;
mod replay;
mod resolution_api;
mod serve;
mod status;
mod storage_failure;
mod support;
mod terminal;
mod tidy;
mod worker;
