//! opledger's black-box tests, in one test binary: the event store conformance suite per backend,
//! crash tests with real child processes, the `opledger` command line, and house-style checks.

mod buttons;
mod cli;
mod conformance;
mod crash;
mod fixtures;
mod intake;
mod polling;
mod postgres;
mod reconcile;
mod serve;
mod storage_failure;
mod support;
mod tidy;
mod worker;
