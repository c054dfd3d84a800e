//! opledger's black-box tests, in one test binary: the event store conformance suite per backend,
//! crash tests with real child processes, the `opledger` command line, and house-style checks.

mod cli;
mod conformance;
mod postgres;
mod support;
mod tidy;
