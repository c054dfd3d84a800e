//! The `opledger` binary: parses the command line and runs it (see `opledger_cli`).

fn main() -> std::process::ExitCode {
    opledger_cli::main()
}
