//! A real `opledger serve` for the benchmarks: started with a configuration written to a
//! folder, found by the address its first line names, stopped with SIGTERM. Shared by the
//! `load` and `gateway` benchmarks (`#[path]` modules: each bench is its own crate).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A running `opledger serve` on a port it chose.
pub(crate) struct Service {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub(crate) base: String,
    /// The configuration file it was started with.
    #[allow(dead_code)] // read by the load bench, not the gateway bench
    pub(crate) config: std::path::PathBuf,
}

/// The `opledger` binary to run: `OPLEDGER_BENCH_BIN` if set (e.g. an older build, to compare
/// in one run; a relative path is taken from where the bench was started, since the service
/// runs in its own folder), else the one Cargo built with the bench.
pub(crate) fn binary() -> std::path::PathBuf {
    std::env::var_os("OPLEDGER_BENCH_BIN").map_or_else(
        || env!("CARGO_BIN_EXE_opledger").into(),
        |path| std::path::absolute(&path).unwrap_or_else(|_| path.into()),
    )
}

impl Service {
    /// Starts `serve` with `config` (TOML, written to `dir/opledger.toml`) and `env`, logging
    /// only errors.
    #[allow(dead_code)] // the load bench passes arguments
    pub(crate) fn start(dir: &std::path::Path, config: &str, env: &[(&str, &str)]) -> Service {
        Service::start_with(dir, config, env, &[])
    }

    /// The same with more arguments after `serve` (`--no-worker`, `--no-projections`).
    pub(crate) fn start_with(
        dir: &std::path::Path,
        config: &str,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Service {
        let path = dir.join("opledger.toml");
        std::fs::write(&path, config).expect("write the configuration");
        let mut child = Command::new(binary())
            .arg("--config")
            .arg(&path)
            .arg("serve")
            .args(args)
            .envs(env.iter().copied())
            .env("OPLEDGER_LOG", "error")
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start opledger serve");
        let stdout = child.stdout.take().expect("stdout");
        let first = BufReader::new(stdout)
            .lines()
            .next()
            .expect("a line")
            .expect("read");
        let address = first
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .expect("the serving line names the address")
            .to_owned();
        Service {
            child,
            base: format!("http://{address}"),
            config: path,
        }
    }

    /// Its process id.
    #[allow(dead_code)] // read by the load bench
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}
