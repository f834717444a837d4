//! Waiting on conditions with a deadline instead of fixed sleeps.

use std::future::Future;
use std::time::Duration;

use tokio::time::{sleep, timeout_at, Instant};

/// How long to wait between two checks of a condition.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls `f` about every 20 ms until it returns `true`.
///
/// The condition is checked at least once, and once more at the deadline.
///
/// # Panics
///
/// Panics with a message naming `what` if the condition is still false after
/// `timeout`, or if one check is itself still running at the deadline.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(timeout, what, || {
        let check = f();
        async move { check.await.then_some(()) }
    })
    .await
}

/// Polls `f` about every 20 ms until it returns `Some(value)`, and returns the
/// value.
///
/// The condition is checked at least once, and once more at the deadline.
///
/// # Panics
///
/// Panics with a message naming `what` if `f` still returns `None` after
/// `timeout`, or if one check is itself still running at the deadline.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    let mut checks: u64 = 0;
    loop {
        checks += 1;
        match timeout_at(deadline, f()).await {
            Ok(Some(value)) => return value,
            Ok(None) => {}
            Err(_) => panic!(
                "timed out after {timeout:?} waiting for {what} \
                 (check #{checks} was still running at the deadline)"
            ),
        }
        let now = Instant::now();
        if now >= deadline {
            panic!("timed out after {timeout:?} waiting for {what} ({checks} checks)");
        }
        sleep(POLL_INTERVAL.min(deadline - now)).await;
    }
}
