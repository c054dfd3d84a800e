//! One module per subcommand.

pub(crate) mod events;
pub(crate) mod migrate;
pub(crate) mod streams;
