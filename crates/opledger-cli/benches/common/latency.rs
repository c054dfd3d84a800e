//! Latency figures for the benchmarks' tables (a `#[path]` module: each bench is its own crate).

use std::time::Duration;

/// The `p` quantile (0 to 1) of `sorted` latencies; a run that measured none fails.
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    assert!(
        !sorted.is_empty(),
        "no request succeeded: is the service configured as the bench expects?"
    );
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Milliseconds with two decimals.
pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}
