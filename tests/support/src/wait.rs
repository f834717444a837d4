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

/// Polls `f` about every 20 ms until it returns `Some(value)`, and returns the value; `None` once `timeout` has
/// passed.
///
/// For a condition the test judges or reports itself (with a process log, or by going on without it) rather than
/// one it requires.
pub async fn poll_for<T, F, Fut>(timeout: Duration, f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_every(POLL_INTERVAL, timeout, f).await
}

/// [`poll_for`] with a yes/no condition: whether it held before `timeout` passed.
pub async fn poll_until<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll_for(timeout, || {
        let check = f();
        async move { check.await.then_some(()) }
    })
    .await
    .is_some()
}

/// [`poll_for`], checking every `interval`: for a check that acts as a client does (a heartbeat each time), at
/// that client's pace.
pub async fn poll_every<T, F, Fut>(interval: Duration, timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = f().await {
            return Some(value);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        sleep(interval.min(deadline - now)).await;
    }
}
