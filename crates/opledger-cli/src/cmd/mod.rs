//! One module per subcommand.

pub(crate) mod events;
pub(crate) mod migrate;
pub(crate) mod ops;
pub(crate) mod serve;
pub(crate) mod streams;
pub(crate) mod webhook;
