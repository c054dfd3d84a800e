//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds the
//! `migrations/` folders at compile time, and on stable Rust cargo does not otherwise know.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
