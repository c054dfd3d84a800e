//! One module per subcommand.

pub(crate) mod audit;
pub(crate) mod demo;
pub(crate) mod events;
pub(crate) mod migrate;
pub(crate) mod ops;
pub(crate) mod projections;
pub(crate) mod reconcile;
pub(crate) mod replay;
pub(crate) mod serve;
pub(crate) mod streams;
pub(crate) mod timeline;
pub(crate) mod webhook;
pub(crate) mod worker;
