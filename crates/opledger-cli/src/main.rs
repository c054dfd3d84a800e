//! The `opledger` binary: parses the command line and runs it (see `opledger_cli`).

/// jemalloc rather than the system allocator: rebuilds, audits and intake allocate and free
/// many short-lived rows on several threads, where glibc's malloc took a quarter of the CPU;
/// with the workspace's `unprefixed_malloc_on_supported_platforms` it is C's `malloc` too, so
/// SQLite's allocations use it (see `bench/README.md`).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    opledger_cli::main()
}
