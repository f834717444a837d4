//! The shutdown gate: process-local terminating state.
//!
//! Order on shutdown: `/readyz` turns unready, new critical sections are refused with
//! `COORDINATOR_TERMINATING`, sections already entered finish (their Redis write and mutex release complete),
//! the tick loop stops scheduling. The gate is checked after the local per-group lock and before the Redis mutex,
//! as the seeds' guardrails require.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// Shared terminating flag and count of critical sections in flight.
#[derive(Debug, Default, Clone)]
pub struct ShutdownGate {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    terminating: AtomicBool,
    in_flight: AtomicUsize,
    idle: Notify,
}

/// Held while a critical section runs; dropping it lets a waiting shutdown proceed.
#[derive(Debug)]
pub struct Entered {
    inner: Arc<Inner>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.inner.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

impl ShutdownGate {
    /// A gate that is open.
    pub fn new() -> Self {
        Self::default()
    }

    /// Enters a critical section, unless terminating.
    pub fn enter(&self) -> Option<Entered> {
        self.inner.in_flight.fetch_add(1, Ordering::AcqRel);
        let entered = Entered {
            inner: self.inner.clone(),
        };
        // Checked after counting, so `close` cannot miss a section that passed the check.
        if self.inner.terminating.load(Ordering::Acquire) {
            return None;
        }
        Some(entered)
    }

    /// Whether shutdown has begun.
    pub fn is_terminating(&self) -> bool {
        self.inner.terminating.load(Ordering::Acquire)
    }

    /// Refuses new sections from now on.
    pub fn begin(&self) {
        self.inner.terminating.store(true, Ordering::Release);
    }

    /// Number of sections in flight.
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::Acquire)
    }

    /// Waits until no section is in flight.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future only stops the wait.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.inner.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn refuses_after_begin_and_waits_for_entered_sections() {
        let gate = ShutdownGate::new();
        let entered = gate.enter().expect("open gate admits");
        gate.begin();
        assert!(gate.enter().is_none(), "terminating gate refuses");
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.wait_idle().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a section is still in flight");
        drop(entered);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(gate.in_flight(), 0);
    }
}
