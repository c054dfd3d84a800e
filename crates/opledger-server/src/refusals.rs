//! Sampled logging of what the HTTP edge refuses: wrong secrets and tokens, connections cut off
//! for being slow or idle at the limit, failed accepts.
//!
//! A flood of refused requests must not become a flood of log lines (a million wrong-secret
//! requests used to write ~90 MB). Each kind of refusal writes at most one line per
//! [`INTERVAL`]: the first refusal after a quiet interval at once, the rest counted and written
//! when the interval has passed, saying how many were refused and from which client addresses
//! (the most frequent few). Every refusal is also counted for `/metrics`.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The shortest time between two lines about one kind of refusal.
pub(crate) const INTERVAL: Duration = Duration::from_secs(10);
/// Client addresses named in a line; the others are counted.
const ADDRESSES_SHOWN: usize = 5;
/// Client addresses counted one by one within an interval; more are counted together, so a
/// flood from many addresses takes bounded memory.
const ADDRESSES_KEPT: usize = 64;
/// Details (bot names, errors) kept within an interval.
const DETAILS_KEPT: usize = 4;

/// What was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A webhook request without the right secret header: 401.
    WebhookSecret,
    /// A read API request without the right admin token: 401.
    AdminToken,
    /// A connection that did not send a request's head within the header-read timeout.
    SlowHead,
    /// A connection that did not take an answer within the header-read timeout.
    SlowReader,
    /// An idle connection closed to make room at the connection limit.
    Evicted,
    /// A connection in the reserved slots that made no authenticated request or health probe.
    Unvouched,
    /// A connection closed at once: the limit was reached and every connection was busy.
    AtLimit,
    /// The listener could not accept a connection (e.g. out of file descriptors).
    AcceptFailed,
}

impl Refusal {
    /// Every kind, in the order of [`Refusals`]' windows.
    pub(crate) const ALL: [Refusal; 8] = [
        Refusal::WebhookSecret,
        Refusal::AdminToken,
        Refusal::SlowHead,
        Refusal::SlowReader,
        Refusal::Evicted,
        Refusal::Unvouched,
        Refusal::AtLimit,
        Refusal::AcceptFailed,
    ];

    /// A stable name, for logs and metric labels.
    pub(crate) fn code(self) -> &'static str {
        match self {
            Refusal::WebhookSecret => "webhook_secret",
            Refusal::AdminToken => "admin_token",
            Refusal::SlowHead => "slow_head",
            Refusal::SlowReader => "slow_reader",
            Refusal::Evicted => "evicted",
            Refusal::Unvouched => "unvouched",
            Refusal::AtLimit => "at_limit",
            Refusal::AcceptFailed => "accept_failed",
        }
    }

    /// What a line counts, for a person.
    fn what(self) -> &'static str {
        match self {
            Refusal::WebhookSecret => "webhook request refused without the right secret (401)",
            Refusal::AdminToken => "read API request refused without the right admin token (401)",
            Refusal::SlowHead => {
                "connection closed for not sending a request head within [server] \
                 header_read_timeout_ms"
            }
            Refusal::SlowReader => {
                "connection closed for not taking an answer within [server] \
                 header_read_timeout_ms"
            }
            Refusal::Evicted => {
                "idle connection closed to make room for a new one ([server] connection_limit \
                 reached)"
            }
            Refusal::Unvouched => {
                "connection closed in a slot kept for authenticated deliveries and health probes \
                 for making neither"
            }
            Refusal::AtLimit => {
                "connection closed at once: every slot was busy ([server] connection_limit \
                 reached)"
            }
            Refusal::AcceptFailed => {
                "connection not accepted (raise the file descriptor limit, `ulimit -n`, or \
                 lower [server] connection_limit)"
            }
        }
    }

    fn index(self) -> usize {
        Refusal::ALL
            .iter()
            .position(|kind| *kind == self)
            .unwrap_or_default()
    }
}

/// The refusals of one kind since its last line.
#[derive(Debug, Default)]
struct Window {
    /// When the first refusal not yet written came.
    first: Option<Instant>,
    /// When the last line was written.
    last_line: Option<Instant>,
    count: u64,
    addresses: HashMap<IpAddr, u64>,
    /// Refusals whose address was not kept (or not known).
    other_addresses: u64,
    details: BTreeSet<String>,
}

impl Window {
    fn due(&self, now: Instant) -> bool {
        self.count > 0
            && self
                .last_line
                .is_none_or(|last| now.duration_since(last) >= INTERVAL)
    }

    /// The line for what was counted, and a fresh window.
    fn take_line(&mut self, kind: Refusal, now: Instant) -> String {
        let mut line = format!("{}: {}", kind.what(), self.count);
        if let Some(first) = self.first
            && self.count > 1
        {
            let secs = now.duration_since(first).as_secs().max(1);
            let _ = write!(line, " in the last {secs} s");
        }
        if !self.details.is_empty() {
            let details: Vec<&str> = self.details.iter().map(String::as_str).collect();
            let _ = write!(line, " ({})", details.join(", "));
        }
        let mut addresses: Vec<(IpAddr, u64)> = self.addresses.drain().collect();
        addresses.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let others = addresses.len().saturating_sub(ADDRESSES_SHOWN);
        if !addresses.is_empty() {
            let shown: Vec<String> = addresses
                .iter()
                .take(ADDRESSES_SHOWN)
                .map(|(address, count)| format!("{address} ({count})"))
                .collect();
            let _ = write!(line, ", from {}", shown.join(", "));
            if others > 0 {
                let _ = write!(line, " and {others} more addresses");
            }
        }
        if self.other_addresses > 0 {
            let _ = write!(line, "; {} from addresses not listed", self.other_addresses);
        }
        *self = Window {
            last_line: Some(now),
            ..Window::default()
        };
        line
    }
}

/// The edge's refusals: one window and one total per kind.
#[derive(Debug)]
pub(crate) struct Refusals {
    windows: [Mutex<Window>; Refusal::ALL.len()],
    totals: [AtomicU64; Refusal::ALL.len()],
}

impl Default for Refusals {
    fn default() -> Self {
        Refusals {
            windows: std::array::from_fn(|_| Mutex::default()),
            totals: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Refusals {
    /// Counts one refusal of `kind` from `client`, with an optional `detail` (a bot name, an
    /// error), and writes a line if none was written for this kind within the interval.
    pub(crate) fn note(&self, kind: Refusal, client: Option<IpAddr>, detail: Option<&str>) {
        self.totals[kind.index()].fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let line = {
            let mut window = self.window(kind);
            window.count += 1;
            window.first.get_or_insert(now);
            match client {
                Some(address)
                    if window.addresses.len() < ADDRESSES_KEPT
                        || window.addresses.contains_key(&address) =>
                {
                    *window.addresses.entry(address).or_default() += 1;
                }
                _ => window.other_addresses += 1,
            }
            if let Some(detail) = detail
                && window.details.len() < DETAILS_KEPT
                && !window.details.contains(detail)
            {
                window.details.insert(detail.to_owned());
            }
            window.due(now).then(|| window.take_line(kind, now))
        };
        if let Some(line) = line {
            write(kind, &line);
        }
    }

    /// Writes the lines whose interval has passed (called every [`INTERVAL`] or so), or every
    /// pending line when `all` (at shutdown).
    pub(crate) fn flush(&self, all: bool) {
        let now = Instant::now();
        for kind in Refusal::ALL {
            let line = {
                let mut window = self.window(kind);
                let due = window.count > 0 && (all || window.due(now));
                due.then(|| window.take_line(kind, now))
            };
            if let Some(line) = line {
                write(kind, &line);
            }
        }
    }

    /// How many refusals of `kind` this process counted since it started.
    pub(crate) fn total(&self, kind: Refusal) -> u64 {
        self.totals[kind.index()].load(Ordering::Relaxed)
    }

    fn window(&self, kind: Refusal) -> std::sync::MutexGuard<'_, Window> {
        // A panic while counting cannot leave a window inconsistent enough to matter.
        self.windows[kind.index()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn write(kind: Refusal, line: &str) {
    tracing::warn!(reason = kind.code(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, last)))
    }

    #[test]
    fn a_window_says_how_many_and_from_where() {
        let now = Instant::now();
        let mut window = Window {
            first: Some(now.checked_sub(Duration::from_secs(7)).unwrap_or(now)),
            ..Window::default()
        };
        for (address, count) in [(1, 50), (2, 3), (3, 1), (4, 1), (5, 1), (6, 1), (7, 2)] {
            window.addresses.insert(ip(address).unwrap(), count);
            window.count += count;
        }
        window.other_addresses = 4;
        window.count += 4;
        window.details.insert("shop".to_owned());
        let line = window.take_line(Refusal::WebhookSecret, now);
        assert_eq!(
            line,
            "webhook request refused without the right secret (401): 63 in the last 7 s (shop), \
             from 192.0.2.1 (50), 192.0.2.2 (3), 192.0.2.7 (2), 192.0.2.3 (1), 192.0.2.4 (1) and \
             2 more addresses; 4 from addresses not listed"
        );
        assert_eq!(window.count, 0, "a fresh window");
        assert!(window.addresses.is_empty() && window.details.is_empty());
        assert_eq!(window.last_line, Some(now));
    }

    #[test]
    fn one_line_per_interval_and_everything_counted() {
        let refusals = Refusals::default();
        for n in 0..1000u32 {
            refusals.note(
                Refusal::AdminToken,
                ip(u8::try_from(n % 100).unwrap()),
                None,
            );
        }
        assert_eq!(refusals.total(Refusal::AdminToken), 1000);
        let window = refusals.window(Refusal::AdminToken);
        // The first refusal was written at once; the other 999 wait for the interval.
        assert_eq!(window.count, 999);
        assert!(window.last_line.is_some());
        assert_eq!(window.addresses.len(), ADDRESSES_KEPT);
        assert_eq!(
            window.addresses.values().sum::<u64>() + window.other_addresses,
            999
        );
        assert!(!window.due(Instant::now()), "not before the interval");
        drop(window);
        refusals.flush(true);
        assert_eq!(refusals.window(Refusal::AdminToken).count, 0);
        assert_eq!(refusals.total(Refusal::AdminToken), 1000);
    }
}
