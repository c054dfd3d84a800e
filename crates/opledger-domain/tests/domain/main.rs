//! The domain crate's one test binary: given/when/then tables, payload snapshots, properties.

mod callback_token;
mod delivery;
mod fixtures;
mod forward;
mod harness;
mod ids;
mod operation;
mod payloads;
mod properties;
mod repeat_guard;
