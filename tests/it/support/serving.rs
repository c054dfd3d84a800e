//! A real `opledger` process (or another child, such as the example aiogram bot) for black-box
//! tests: a clean environment, its output captured as it comes, waits for lines and for its
//! end, SIGTERM and SIGKILL, and no process left behind.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::app::{Ledger, SECRET};
use crate::support::fake_service::FakeService;
use crate::support::fake_telegram::FakeTelegram;
use crate::support::{opledger_bin, sqlite_url, stderr, stdout};

/// How long a condition may take before the test fails.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// The real binary with a clean environment (so the developer's own `OPLEDGER_*` variables
/// cannot leak in) plus `env`.
pub(crate) fn opledger(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(opledger_bin());
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied());
    command
}

/// Runs a command to completion off the async runtime, which serves the fake Bot API meanwhile.
pub(crate) async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run opledger"))
        .await
        .expect("the command's thread")
}

/// POSTs an update to bot `shop`'s webhook with the test secret, as Telegram does; `None`
/// when no answer came (the process died).
pub(crate) async fn deliver(address: SocketAddr, update: &[u8]) -> Option<u16> {
    reqwest::Client::new()
        .post(format!("http://{address}/telegram/shop/webhook"))
        .header("content-type", "application/json")
        .header("x-telegram-bot-api-secret-token", SECRET)
        .body(update.to_vec())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()
        .map(|response| response.status().as_u16())
}

/// Writes `text` as a configuration file in `dir`.
pub(crate) fn write_config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write the configuration");
    path
}

/// Writes `opledger.toml` in `dir` for a `serve` on `ledger` with bot `shop` (on the fake Bot
/// API `telegram`) and the coupon action calling `service` with the `[actions.effector]` keys
/// `effector_keys`; returns its path.
pub(crate) fn write_coupon_config(
    dir: &Path,
    ledger: &Ledger,
    telegram: &FakeTelegram,
    service: &FakeService,
    effector_keys: &str,
) -> String {
    let text = format!(
        "[storage]\nurl = \"{ledger}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
         [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
         webhook_secret_env = \"SHOP_SECRET\"\napi_base_url = \"{api}\"\n\
         [[actions]]\nname = \"coupon\"\nbot = \"shop\"\ncommand = \"coupon\"\n\
         params = [\"campaign\"]\nkey = \"{{campaign}}:{{user_id}}\"\n\
         [actions.effector]\nurl = \"{effector}\"\n{effector_keys}",
        ledger = ledger.url(),
        api = telegram.base_url(),
        effector = service.url(),
    );
    let path = write_config(dir, "opledger.toml", &text);
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// A running `opledger serve` (or other child process) whose stdout and stderr are captured as
/// they come.
pub(crate) struct Serving {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

/// Copies a child's stream into `sink`, line by line, until it closes.
fn capture(stream: impl Read + Send + 'static, sink: Arc<Mutex<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
            sink.lock()
                .expect("not poisoned")
                .push_str(&String::from_utf8_lossy(&line));
            line.clear();
        }
    })
}

impl Serving {
    /// Starts `opledger serve` with `command`'s environment and arguments.
    pub(crate) fn start(mut command: Command) -> Serving {
        command.arg("serve");
        Self::spawn(command)
    }

    /// Starts `command` as it is.
    pub(crate) fn spawn(mut command: Command) -> Serving {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("start {command:?}: {error}"));
        let (stdout, stderr) = (Arc::default(), Arc::default());
        let readers = vec![
            capture(child.stdout.take().expect("piped"), Arc::clone(&stdout)),
            capture(child.stderr.take().expect("piped"), Arc::clone(&stderr)),
        ];
        Serving {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    pub(crate) fn stdout(&self) -> String {
        self.stdout.lock().expect("not poisoned").clone()
    }

    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().expect("not poisoned").clone()
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for a stdout line containing `needle`; `Err` with the exit status if the process
    /// ended first.
    pub(crate) async fn line(&mut self, needle: &str) -> Result<String, ExitStatus> {
        self.wait_for(needle, Self::stdout, "stdout").await
    }

    /// Waits for a stderr line containing `needle` (a log line); `Err` with the exit status if
    /// the process ended first.
    pub(crate) async fn logged(&mut self, needle: &str) -> Result<String, ExitStatus> {
        self.wait_for(needle, Self::stderr, "stderr").await
    }

    async fn wait_for(
        &mut self,
        needle: &str,
        output: fn(&Self) -> String,
        name: &str,
    ) -> Result<String, ExitStatus> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(line) = output(self).lines().find(|l| l.contains(needle)) {
                return Ok(line.to_owned());
            }
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                // Let the readers drain what the process wrote before it ended.
                for reader in std::mem::take(&mut self.readers) {
                    reader.join().expect("a reader thread");
                }
                if let Some(line) = output(self).lines().find(|l| l.contains(needle)) {
                    return Ok(line.to_owned());
                }
                return Err(status);
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for `{needle}` on {name}; stdout: {}\nstderr: {}",
                self.stdout(),
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The address from "opledger is serving on http://ADDRESS with the ledger ...".
    pub(crate) async fn address(&mut self) -> SocketAddr {
        let line = self
            .line("opledger is serving on http://")
            .await
            .unwrap_or_else(|status| panic!("serve ended with {status}: {}", self.stderr()));
        line.split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|address| address.parse().ok())
            .unwrap_or_else(|| panic!("no address in `{line}`"))
    }

    /// Sends SIGTERM and waits for the process to end; its output is complete afterwards.
    pub(crate) async fn terminate(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM {pid}");
        self.exit().await
    }

    /// Kills the process with SIGKILL (`kill -9`: no cleanup, no flush) and waits for its end.
    pub(crate) async fn kill(&mut self) -> ExitStatus {
        self.child.kill().expect("send SIGKILL");
        self.exit().await
    }

    /// Waits for the process to end (by itself, e.g. aborted at a crash point, or after a
    /// signal); its output is complete afterwards.
    pub(crate) async fn exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the process did not end; stderr: {}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        for reader in std::mem::take(&mut self.readers) {
            reader.join().expect("a reader thread");
        }
        status
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        // A failing test must not leave its service running.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `opledger events --json` of a SQLite ledger, as parsed lines and as text.
pub(crate) async fn ledger_events(ledger: &Path) -> (Vec<Value>, String) {
    let mut command = opledger(&[]);
    command
        .arg("--database-url")
        .arg(sqlite_url(ledger))
        .args(["events", "--json"]);
    let output = run(command).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    (lines, text)
}
