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

/// The workspace crates a crate's `[dependencies]` name (dev-dependencies may reach higher: a
/// crate's tests can use what depends on it).
fn workspace_dependencies(krate: &str) -> std::collections::BTreeSet<String> {
    let path = workspace_root()
        .join("crates")
        .join(krate)
        .join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let manifest: toml::Table = text.parse().expect("a crate manifest is TOML");
    ["dependencies", "build-dependencies"]
        .iter()
        .filter_map(|table| manifest.get(*table).and_then(toml::Value::as_table))
        .flat_map(|deps| deps.keys())
        .filter(|name| name.starts_with("opledger"))
        .cloned()
        .collect()
}

/// The crates in `crates/`, by folder name.
fn workspace_crates() -> Vec<String> {
    let mut crates: Vec<String> = std::fs::read_dir(workspace_root().join("crates"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join("Cargo.toml").is_file())
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    crates.sort();
    crates
}

/// The crate graph is layered as `docs/ARCHITECTURE.md` draws it: each crate may depend only on
/// the workspace crates listed for it here, and a new crate must take its place in the table.
#[test]
fn each_crate_depends_only_on_the_crates_below_it() {
    const DOMAIN: &str = "opledger-domain";
    const STORE: &str = "opledger-store";
    const TELEGRAM: &str = "opledger-telegram";
    const CONFIG: &str = "opledger-config";
    const LEDGER: &str = "opledger-ledger";
    const PROJECTIONS: &str = "opledger-projections";
    const AUDIT: &str = "opledger-audit";
    const SERVER: &str = "opledger-server";
    const WORKER: &str = "opledger-worker";
    let service: &[&str] = &[CONFIG, DOMAIN, LEDGER, PROJECTIONS, STORE, TELEGRAM];
    let layers: &[(&str, &[&str])] = &[
        (DOMAIN, &[]),
        (STORE, &[]),
        (TELEGRAM, &[DOMAIN]),
        (CONFIG, &[DOMAIN]),
        (LEDGER, &[DOMAIN, STORE]),
        (PROJECTIONS, &[DOMAIN, STORE]),
        (AUDIT, &[LEDGER, STORE]),
        (SERVER, service),
        (WORKER, service),
        ("opledger", &[CONFIG, PROJECTIONS, SERVER, STORE, WORKER]),
        (
            "opledger-cli",
            &[
                AUDIT,
                CONFIG,
                DOMAIN,
                LEDGER,
                PROJECTIONS,
                SERVER,
                STORE,
                TELEGRAM,
                WORKER,
            ],
        ),
    ];
    let mut problems = Vec::new();
    for krate in workspace_crates() {
        let Some((_, allowed)) = layers.iter().find(|(name, _)| *name == krate) else {
            problems.push(format!(
                "{krate} has no place in the layer table of tidy.rs"
            ));
            continue;
        };
        for dependency in workspace_dependencies(&krate) {
            if !allowed.contains(&dependency.as_str()) {
                problems.push(format!("{krate} must not depend on {dependency}"));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The three edges the architecture rests on, named on their own so a failure says which.
#[test]
fn the_store_and_domain_depend_on_no_workspace_crate_and_the_server_not_on_the_worker() {
    for krate in ["opledger-store", "opledger-domain"] {
        let dependencies = workspace_dependencies(krate);
        assert!(
            dependencies.is_empty(),
            "{krate} must stand alone, but depends on {dependencies:?}"
        );
    }
    assert!(
        !workspace_dependencies("opledger-server").contains("opledger-worker"),
        "the server must not depend on the worker: serve composes them in the CLI"
    );
}

/// The top-level modules (`src/<name>.rs` or `src/<name>/`) of a crate that each module refers
/// to through `crate::`.
fn module_references(
    krate: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let src = workspace_root().join("crates").join(krate).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for path in files {
        let relative = path.strip_prefix(&src).unwrap();
        let first = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let references = graph.entry(module.clone()).or_default();
        let mut rest = code.as_str();
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != module {
                references.insert(name);
            }
        }
    }
    graph
}

/// Crates whose modules still refer to each other in a circle, with why; each entry is checked to
/// still be needed, so the list only shrinks.
const MODULE_CYCLES_LEFT: &[(&str, &str)] = &[
    (
        "opledger-domain",
        "the shared error type names operation states and ids, which name it back",
    ),
    (
        "opledger-store",
        "the model, its errors, the chain and inline projections share types both ways",
    ),
    (
        "opledger-projections",
        "the runner starts background rebuilds, which share the runner's page reader",
    ),
    (
        "opledger-server",
        "the app builds the routers, whose handlers take the app's shared state",
    ),
];

/// The cycles among a crate's top-level modules, one line per module that reaches itself.
fn module_cycles(krate: &str) -> Vec<String> {
    let graph = module_references(krate);
    let mut cycles = Vec::new();
    // Depth-first search for a path back to the start, from every module.
    for start in graph.keys() {
        let mut stack: Vec<Vec<&String>> = vec![vec![start]];
        let mut seen = std::collections::BTreeSet::new();
        while let Some(path) = stack.pop() {
            let last = *path.last().unwrap();
            for next in graph.get(last).into_iter().flatten() {
                if next == start {
                    let names: Vec<&str> = path.iter().map(|m| m.as_str()).collect();
                    cycles.push(format!("{krate}: {} -> {start}", names.join(" -> ")));
                } else if graph.contains_key(next) && seen.insert(next) {
                    let mut longer = path.clone();
                    longer.push(next);
                    stack.push(longer);
                }
            }
        }
    }
    cycles.sort();
    cycles
}

/// Within a crate, no module uses one that uses it back (directly or through others): each
/// module can be read knowing only the ones below it (the worker: `worker` -> `call` and
/// `reply` -> `handle`).
#[test]
fn no_module_uses_a_module_that_uses_it() {
    let mut problems = Vec::new();
    for krate in workspace_crates() {
        let cycles = module_cycles(&krate);
        let exempt = MODULE_CYCLES_LEFT.iter().any(|(name, _)| *name == krate);
        if exempt && cycles.is_empty() {
            problems.push(format!(
                "{krate} has no module cycle left: drop it from MODULE_CYCLES_LEFT"
            ));
        } else if !exempt {
            problems.extend(cycles);
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// `docs/ARCHITECTURE.md` stays a map: short enough to read in a minute, with every crate in its
/// codemap and the four entry points named.
#[test]
fn the_architecture_map_is_short_and_names_every_crate() {
    let map = std::fs::read_to_string(workspace_root().join("docs/ARCHITECTURE.md")).unwrap();
    let lines = map.lines().count();
    assert!(
        lines <= 130,
        "docs/ARCHITECTURE.md has {lines} lines; keep it a map (≤ 130)"
    );
    let mut missing: Vec<String> = workspace_crates()
        .into_iter()
        .filter(|krate| !map.contains(&format!("**`{krate}`**")))
        .collect();
    for entry in [
        "**An update**",
        "**A worker step**",
        "**A projection page**",
        "**A CLI command**",
    ] {
        if !map.contains(entry) {
            missing.push(entry.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md does not name {missing:?}"
    );
}
