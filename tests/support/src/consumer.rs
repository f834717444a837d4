//! Consumer helpers: a builder with the short [`timings`](crate::timings), and [`wait_status`].

use crate::timings::{HEARTBEAT, LEASE, MARGIN, MEMBER_TTL};
use std::time::Duration;
use stream_consumer::{Consumer, ConsumerBuilder, ConsumerHandle, ConsumerStatus};

/// A consumer builder for `member` of `group` on `stream` with the short timings, short request timeout, read
/// block and retry backoff, and no coordinator, Redis or handler yet.
pub fn builder(stream: &str, group: &str, member: &str) -> ConsumerBuilder {
    Consumer::builder(stream, group)
        .member_id(member)
        .heartbeat_interval(HEARTBEAT)
        .member_ttl(MEMBER_TTL)
        .assignment_lease(LEASE)
        .lease_safety_margin(MARGIN)
        .request_timeout(Duration::from_millis(400))
        .read_block(Duration::from_millis(300))
        .drain_timeout(Duration::from_secs(5))
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(200))
}

/// Waits until `handle`'s status satisfies `f` and returns that status.
///
/// # Panics
/// After `timeout`, with `what` and the last status.
pub async fn wait_status(
    handle: &ConsumerHandle,
    timeout: Duration,
    what: &str,
    f: impl Fn(&ConsumerStatus) -> bool,
) -> ConsumerStatus {
    let mut rx = handle.watch_status();
    let waited = tokio::time::timeout(timeout, async {
        loop {
            {
                let s = rx.borrow_and_update();
                if f(&s) {
                    return s.clone();
                }
            }
            if rx.changed().await.is_err() {
                // The consumer stopped: no further change will come.
                std::future::pending::<()>().await;
            }
        }
    })
    .await;
    match waited {
        Ok(s) => s,
        Err(_) => panic!(
            "timed out after {timeout:?} waiting for {what}; last status: {:#?}",
            *rx.borrow()
        ),
    }
}
