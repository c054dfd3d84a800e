//! The example aiogram bot (`examples/aiogram-bot/bot.py`) as a child process of the black-box
//! tests: started, stopped and started again on the same port, and what it received (one JSON
//! line per webhook request it was sent, with opledger's headers) read back from its record.
//!
//! Its Python comes from `OPLEDGER_TEST_AIOGRAM_PYTHON` (a virtualenv with the pinned
//! `examples/aiogram-bot/requirements.txt`, which `.ci/run` makes). Without it the tests are
//! skipped with a message on stderr, except under CI (`CI` set), where that is a failure: a green
//! run must mean the aiogram tests ran.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::support::serving::{PATIENCE, Serving};

/// The variable naming the Python that has aiogram installed.
const PYTHON_ENV: &str = "OPLEDGER_TEST_AIOGRAM_PYTHON";

/// The Python to run the bot with, or `None` after saying on stderr that the aiogram tests were
/// skipped (a panic under CI).
pub(crate) fn python() -> Option<PathBuf> {
    match std::env::var_os(PYTHON_ENV) {
        Some(path) if !path.is_empty() => {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "{PYTHON_ENV} names {}, which is not a file",
                path.display()
            );
            Some(path)
        }
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "{PYTHON_ENV} is not set under CI; .ci/run installs aiogram into a virtualenv \
                 and sets it"
            );
            eprintln!(
                "SKIPPED: {PYTHON_ENV} is not set; make a virtualenv with \
                 examples/aiogram-bot/requirements.txt and set it to its python to run the \
                 aiogram tests"
            );
            None
        }
    }
}

/// A free loopback port (free when asked: the caller binds it soon after).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// What the bot is told (its environment variables, see `examples/aiogram-bot/README.md`).
#[derive(Debug, Clone)]
pub(crate) struct BotSettings {
    pub(crate) token: String,
    /// The secret opledger presents as `X-Telegram-Bot-Api-Secret-Token`.
    pub(crate) secret: String,
    pub(crate) opledger_url: String,
    pub(crate) client_token: String,
    pub(crate) telegram_base: String,
    /// How long it waits before answering each webhook request (a slow bot).
    pub(crate) answer_delay_ms: u64,
}

/// One webhook request as the bot recorded it on arrival.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Received {
    pub(crate) header_update_id: Option<String>,
    pub(crate) attempt: Option<String>,
    pub(crate) secret_ok: bool,
    pub(crate) content_type: Option<String>,
    pub(crate) update_id: Option<i64>,
    pub(crate) chat_id: Option<i64>,
    /// SHA-256 of the body's bytes, hex.
    pub(crate) sha256: String,
}

impl Received {
    /// `X-Opledger-Attempt` as a number.
    pub(crate) fn attempt(&self) -> u64 {
        self.attempt
            .as_deref()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no X-Opledger-Attempt number: {self:?}"))
    }
}

/// The bot, stopped or running, always on the same address.
pub(crate) struct AiogramBot {
    python: PathBuf,
    settings: BotSettings,
    listen: SocketAddr,
    record: PathBuf,
    process: Option<Serving>,
}

impl AiogramBot {
    /// A bot that will listen on a free port and record into `dir`; not started yet.
    pub(crate) fn new(python: PathBuf, dir: &Path, settings: BotSettings) -> AiogramBot {
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        AiogramBot {
            python,
            settings,
            listen,
            record: dir.join("aiogram-received.jsonl"),
            process: None,
        }
    }

    /// The URL opledger forwards to (`[bots.forward] url`).
    pub(crate) fn webhook_url(&self) -> String {
        format!("http://{}/webhook", self.listen)
    }

    /// Starts the process without waiting for it to listen (Python takes a few seconds to
    /// import aiogram; start other things meanwhile, then [`AiogramBot::ready`]).
    pub(crate) fn spawn(&mut self) {
        assert!(self.process.is_none(), "the bot is already running");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/aiogram-bot/bot.py");
        let mut command = Command::new(&self.python);
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONUNBUFFERED", "1")
            .env("BOT_TOKEN", &self.settings.token)
            .env("BOT_WEBHOOK_SECRET", &self.settings.secret)
            .env("BOT_LISTEN", self.listen.to_string())
            .env("OPLEDGER_URL", &self.settings.opledger_url)
            .env("OPLEDGER_TOKEN", &self.settings.client_token)
            .env("TELEGRAM_API_BASE", &self.settings.telegram_base)
            .env("BOT_RECORD_FILE", &self.record)
            .env(
                "BOT_ANSWER_DELAY_MS",
                self.settings.answer_delay_ms.to_string(),
            )
            .arg(script);
        self.process = Some(Serving::spawn(command));
    }

    /// Waits until the spawned bot listens.
    pub(crate) async fn ready(&mut self) {
        let process = self.process.as_mut().expect("the bot was spawned");
        if let Err(status) = process.line("aiogram bot listening on").await {
            panic!("the bot ended with {status}: {}", process.stderr());
        }
    }

    /// Starts the bot and waits until it listens.
    pub(crate) async fn start(&mut self) {
        self.spawn();
        self.ready().await;
    }

    /// Stops the bot (SIGTERM) and waits for its end.
    pub(crate) async fn stop(&mut self) {
        let mut process = self.process.take().expect("the bot is running");
        process.terminate().await;
    }

    /// What the bot wrote on stderr (aiogram's log), for failure messages.
    pub(crate) fn log(&self) -> String {
        self.process
            .as_ref()
            .map(Serving::stderr)
            .unwrap_or_default()
    }

    /// Every webhook request the bot received so far, in arrival order, with the right secret
    /// or not.
    pub(crate) fn received(&self) -> Vec<Received> {
        let text = match std::fs::read_to_string(&self.record) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(error) => panic!("read the bot's record: {error}"),
        };
        // A line being written while it is read is incomplete: only whole lines count.
        text.split_inclusive('\n')
            .filter(|line| line.ends_with('\n'))
            .map(|line| {
                serde_json::from_str(line).unwrap_or_else(|e| panic!("a record line ({e}): {line}"))
            })
            .collect()
    }

    /// The requests received for `update_id`, in arrival order.
    pub(crate) fn received_for(&self, update_id: i64) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.update_id == Some(update_id))
            .collect()
    }

    /// Waits until what the bot received satisfies `done`; fails naming `what`.
    pub(crate) async fn wait_until(
        &self,
        what: &str,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let received = self.received();
            if done(&received) {
                return received;
            }
            assert!(
                Instant::now() < deadline,
                "the bot did not receive {what}; it received {received:#?}\nits log: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
