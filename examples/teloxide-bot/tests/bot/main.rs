//! The example bot as a user would run it, against a fake Bot API on loopback, in poll and in
//! webhook mode: a redelivered update is handled once, a kill -9 between the coupon and its
//! reply never issues a second coupon, `/status` shows the outcome after the restart, and a
//! double click on the confirmation button starts one operation.

mod fake_bot_api;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fake_bot_api::{FakeBotApi, click, message};
use serde_json::Value;
use tokio::process::{Child, Command};

const TOKEN: &str = "123456:example-token";
const SECRET: &str = "example-webhook-secret";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Poll,
    Webhook,
}

/// One bot's files and fake, and the running process.
struct Harness {
    mode: Mode,
    dir: tempfile::TempDir,
    fake: FakeBotApi,
    listen: String,
    child: Option<Child>,
    http: reqwest::Client,
}

impl Harness {
    async fn new(mode: Mode) -> Harness {
        let listen = {
            let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            socket.local_addr().expect("its address").to_string()
        };
        Harness {
            mode,
            dir: tempfile::tempdir().expect("a temporary directory"),
            fake: FakeBotApi::start(TOKEN).await,
            listen,
            child: None,
            http: reqwest::Client::new(),
        }
    }

    fn coupons_file(&self) -> PathBuf {
        self.dir.path().join("coupons.jsonl")
    }

    fn coupons(&self) -> Vec<Value> {
        std::fs::read_to_string(self.coupons_file())
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a coupon line"))
            .collect()
    }

    /// Starts the bot; `shop_delay` makes the shop answer that much after issuing a coupon.
    async fn start(&mut self, shop_delay: Option<Duration>) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_teloxide-bot"));
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("BOT_TOKEN", TOKEN)
            .env("TELEGRAM_API_URL", self.fake.url())
            .env(
                "LEDGER_URL",
                format!("sqlite://{}", self.dir.path().join("bot.db").display()),
            )
            .env("COUPONS_FILE", self.coupons_file())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if self.mode == Mode::Webhook {
            command
                .env("WEBHOOK_LISTEN", &self.listen)
                .env("WEBHOOK_SECRET", SECRET);
        }
        if let Some(delay) = shop_delay {
            command.env("SHOP_DELAY_MS", delay.as_millis().to_string());
        }
        self.child = Some(command.spawn().expect("the example bot starts"));
        if self.mode == Mode::Webhook {
            let url = format!("http://{}/healthz", self.listen);
            eventually("the webhook answers", Duration::from_secs(30), || async {
                self.http.get(&url).send().await.is_ok()
            })
            .await;
        }
    }

    /// `kill -9`.
    async fn kill(&mut self) {
        let mut child = self.child.take().expect("a running bot");
        child.start_kill().expect("SIGKILL");
        child.wait().await.expect("the bot is gone");
    }

    /// Telegram sends `update` (polled, or posted to the webhook); a webhook's answer body.
    async fn send(&self, update: &Value) -> Option<Value> {
        match self.mode {
            Mode::Poll => {
                self.fake.push(update.clone());
                None
            }
            Mode::Webhook => Some(self.post(update).await),
        }
    }

    /// Telegram sends `update` again after it was acknowledged.
    async fn send_again(&self, update: &Value) {
        match self.mode {
            Mode::Poll => self.fake.deliver_again(update.clone()),
            Mode::Webhook => {
                self.post(update).await;
            }
        }
    }

    async fn post(&self, update: &Value) -> Value {
        let url = format!("http://{}/telegram/shop/webhook", self.listen);
        let response = self
            .http
            .post(&url)
            .header("x-telegram-bot-api-secret-token", SECRET)
            .json(update)
            .send()
            .await
            .expect("the webhook answers");
        assert_eq!(response.status(), 200, "an update is acknowledged");
        response.json().await.unwrap_or(Value::Null)
    }

    fn texts_with(&self, prefix: &str) -> Vec<String> {
        self.fake
            .texts()
            .into_iter()
            .filter(|t| t.starts_with(prefix))
            .collect()
    }
}

async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn redelivered_update_is_handled_once(mode: Mode) {
    let mut bot = Harness::new(mode).await;
    bot.start(None).await;
    let update = message(1, "/coupon spring");
    bot.send(&update).await;
    eventually(
        "the coupon is answered",
        Duration::from_secs(30),
        || async { !bot.texts_with("Your coupon for spring:").is_empty() },
    )
    .await;
    for _ in 0..3 {
        bot.send_again(&update).await;
    }
    // A second, later update proves the redeliveries were taken (and dropped) before it.
    bot.send(&message(2, "/help")).await;
    eventually(
        "the next update is answered",
        Duration::from_secs(30),
        || async {
            bot.fake
                .texts()
                .iter()
                .any(|t| t.starts_with("Send /coupon"))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answers = bot.texts_with("Your coupon for spring:");
    assert_eq!(answers.len(), 1, "handled once: {:?}", bot.fake.texts());
    let coupons = bot.coupons();
    assert_eq!(coupons.len(), 1, "one coupon: {coupons:?}");
    assert_eq!(
        answers[0],
        format!(
            "Your coupon for spring: {}",
            coupons[0]["code"].as_str().unwrap()
        )
    );
}

async fn a_kill_after_the_coupon_never_issues_a_second(mode: Mode) {
    let mut bot = Harness::new(mode).await;
    bot.start(Some(Duration::from_secs(60))).await;
    bot.send(&message(7, "/coupon autumn")).await;
    eventually(
        "the shop issued the coupon",
        Duration::from_secs(30),
        || async { !bot.coupons().is_empty() },
    )
    .await;
    bot.kill().await;
    assert!(
        bot.texts_with("Your coupon").is_empty(),
        "killed before the reply: {:?}",
        bot.fake.texts()
    );

    bot.start(None).await;
    eventually(
        "the handler answers after the restart",
        Duration::from_secs(60),
        || async { !bot.texts_with("Your coupon for autumn:").is_empty() },
    )
    .await;
    let coupons = bot.coupons();
    assert_eq!(coupons.len(), 1, "the effect was not repeated: {coupons:?}");
    let code = coupons[0]["code"].as_str().unwrap().to_owned();
    assert_eq!(
        bot.texts_with("Your coupon for autumn:"),
        [format!("Your coupon for autumn: {code}")]
    );

    let answer = bot.send(&message(8, "/status")).await;
    let status = match answer {
        Some(webhook_answer) => {
            assert_eq!(webhook_answer["method"], "sendMessage", "{webhook_answer}");
            webhook_answer["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        }
        None => {
            let mut text = String::new();
            eventually("/status is answered", Duration::from_secs(30), || {
                let found = bot
                    .fake
                    .texts()
                    .into_iter()
                    .find(|t| t.contains("coupon") && !t.starts_with("Your coupon"));
                if let Some(found) = found {
                    text = found;
                }
                std::future::ready(!text.is_empty())
            })
            .await;
            text
        }
    };
    assert!(status.contains("coupon 42:autumn: done"), "{status}");
    assert!(status.contains(&code), "{status}");
}

async fn a_double_click_on_the_button_issues_one_coupon(mode: Mode) {
    let mut bot = Harness::new(mode).await;
    bot.start(None).await;
    bot.send(&message(20, "/gift winter")).await;
    let mut token = String::new();
    eventually("the button is sent", Duration::from_secs(30), || {
        let sent = bot.fake.calls("sendMessage");
        let data = sent.iter().find_map(|call| {
            call["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
                .as_str()
                .map(str::to_owned)
        });
        if let Some(data) = data {
            token = data;
        }
        std::future::ready(!token.is_empty())
    })
    .await;
    bot.send(&click(21, &token)).await;
    bot.send(&click(22, &token)).await;
    eventually("the reply is sent", Duration::from_secs(30), || async {
        !bot.texts_with("Your coupon for winter:").is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(bot.coupons().len(), 1, "one coupon");
    assert_eq!(
        bot.texts_with("Your coupon for winter:").len(),
        1,
        "one reply"
    );
}

#[tokio::test]
async fn poll_redelivered_update_is_handled_once() {
    redelivered_update_is_handled_once(Mode::Poll).await;
}

#[tokio::test]
async fn webhook_redelivered_update_is_handled_once() {
    redelivered_update_is_handled_once(Mode::Webhook).await;
}

#[tokio::test]
async fn poll_a_kill_after_the_coupon_never_issues_a_second() {
    a_kill_after_the_coupon_never_issues_a_second(Mode::Poll).await;
}

#[tokio::test]
async fn webhook_a_kill_after_the_coupon_never_issues_a_second() {
    a_kill_after_the_coupon_never_issues_a_second(Mode::Webhook).await;
}

#[tokio::test]
async fn poll_a_double_click_on_the_button_issues_one_coupon() {
    a_double_click_on_the_button_issues_one_coupon(Mode::Poll).await;
}

#[tokio::test]
async fn webhook_a_double_click_on_the_button_issues_one_coupon() {
    a_double_click_on_the_button_issues_one_coupon(Mode::Webhook).await;
}
