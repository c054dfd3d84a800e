//! Crash points for the crash tests (intake and worker): with the `failpoints` feature, a point configured with
//! `FAILPOINTS=<name>=return` aborts the process right there, like `kill -9`. Without the
//! feature (every shipped build) they compile to nothing.

/// Aborts the process if the failpoint `name` is configured.
#[inline]
pub fn crash(name: &str) {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |_| {
        tracing::error!(failpoint = name, "failpoint reached: aborting the process");
        std::process::abort()
    });
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}
