//! House-style checks that run as ordinary tests, so CI needs nothing beyond the test command.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the crate sits two levels below the workspace root")
        .to_path_buf()
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

fn project_rust_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in ["crates", "tests"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 10, "found the project's sources");
    files
}

/// Every Rust file says what it is for in a `//!` line, before any code.
#[test]
fn every_rust_file_starts_with_a_module_doc() {
    let missing: Vec<String> = project_rust_files()
        .into_iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            !text
                .lines()
                .find(|l| !l.trim().is_empty())
                .is_some_and(|l| l.starts_with("//!"))
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "files without a `//!` line: {missing:#?}"
    );
}

/// A skipped test is a test that cannot fail.
#[test]
fn no_ignored_tests() {
    let marker = concat!("#[", "ignore");
    let offenders: Vec<String> = project_rust_files()
        .into_iter()
        .filter(|path| std::fs::read_to_string(path).unwrap().contains(marker))
        .map(|p| p.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "ignored tests in: {offenders:#?}");
}

/// The domain crate is pure: no I/O, no async, no clock, no randomness, no database. (Its
/// dependencies are checked by its Cargo.toml: chrono without `clock`, no tokio, no sqlx; this
/// catches what a dependency could still offer.)
#[test]
fn the_domain_crate_does_no_io_and_reads_no_clock() {
    let mut files = Vec::new();
    rust_files(
        &workspace_root().join("crates/opledger-domain/src"),
        &mut files,
    );
    assert!(!files.is_empty());
    let forbidden = [
        "std::fs",
        "std::net",
        "std::io::",
        "std::env",
        "std::thread",
        "std::process",
        "SystemTime",
        "Instant::now",
        "Utc::now",
        "Local::now",
        "async fn",
        ".await",
        "tokio",
        "sqlx",
        "rand::",
        "getrandom",
        "Uuid::new_v4",
    ];
    let mut offenders = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        // Code only: documentation may say what the crate does not do.
        let code = text.lines().filter(|l| !l.trim_start().starts_with("//"));
        for (line, needle) in code.flat_map(|l| forbidden.iter().map(move |n| (l, *n))) {
            if line.contains(needle) {
                offenders.push(format!("{}: {needle}", path.display()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "impure code in the domain crate: {offenders:#?}"
    );
}

/// Only the store and projection crates speak SQL (the tests may, to check from outside).
#[test]
fn only_the_store_and_projections_contain_sql() {
    let root = workspace_root();
    let mut offenders = Vec::new();
    for krate in [
        "opledger-audit",
        "opledger-domain",
        "opledger-telegram",
        "opledger-config",
        "opledger-server",
    ] {
        let manifest =
            std::fs::read_to_string(root.join("crates").join(krate).join("Cargo.toml")).unwrap();
        if manifest.lines().any(|l| l.trim_start().starts_with("sqlx")) {
            offenders.push(format!("{krate} depends on sqlx"));
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}

/// The files of a folder by name, with their bytes.
fn folder_files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).expect("read a fixture");
            (name, bytes)
        })
        .collect()
}

/// The workspace's copy of the shared Telegram fixtures (`tests/fixtures/telegram/updates`) is
/// the shared folder, file for file, wherever that folder sits next to the workspace. A clone
/// without it (CI anywhere else) has only the copy, and nothing to compare.
#[test]
fn telegram_fixtures_match_the_shared_copy() {
    let root = workspace_root();
    let copy = folder_files(&root.join("tests/fixtures/telegram/updates"));
    assert!(copy.len() > 50, "the fixture copy holds the updates");
    let Some(shared) = root
        .parent()
        .map(|parent| parent.join("shared/fixtures/telegram/updates"))
        .filter(|dir| dir.is_dir())
    else {
        eprintln!(
            "no ../shared/fixtures/telegram/updates next to the workspace; nothing to compare"
        );
        return;
    };
    let shared = folder_files(&shared);
    let differing: Vec<&String> = shared
        .keys()
        .chain(copy.keys())
        .filter(|name| shared.get(*name) != copy.get(*name))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(
        differing.is_empty(),
        "tests/fixtures/telegram/updates differs from ../shared in {differing:?}: refresh the copy \
         as tests/fixtures/telegram/README.md says"
    );
}
