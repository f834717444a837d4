//! In-flight work per shard: how many entries a shard's reader has taken on and not yet finished (handler,
//! then XACK or dead-lettering).
//!
//! Pure bookkeeping (std atomics only). A shard reader handles its entries one at a time, so the count is 0 or 1
//! in practice; it is still a counter so the invariant "a shard is reported REVOKED only with nothing in flight"
//! is checked, not assumed. The waiting itself happens in the heartbeat loop, which learns that a reader stopped
//! from the reader's exit, and checks the counter before reporting the shard revoked.

#[cfg(test)]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// In-flight counter of one shard (one per reader).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    current: AtomicUsize,
    // Only the tests read it: in a build it would be one more atomic operation per entry for nobody.
    #[cfg(test)]
    finished: AtomicU64,
}

impl InFlight {
    /// Marks one entry as taken on; the work is finished when the guard drops (also when the future holding it
    /// is dropped, so a cancelled reader never leaves the counter up).
    pub(crate) fn begin(self: &Arc<Self>) -> InFlightGuard {
        self.current.fetch_add(1, Ordering::AcqRel);
        InFlightGuard {
            owner: Arc::clone(self),
        }
    }

    /// Entries in flight now.
    pub(crate) fn current(&self) -> usize {
        self.current.load(Ordering::Acquire)
    }

    /// Entries finished (acknowledged, dead-lettered or given up) since the reader started.
    #[cfg(test)]
    pub(crate) fn finished(&self) -> u64 {
        self.finished.load(Ordering::Acquire)
    }
}

/// One entry in flight; finished on drop.
#[derive(Debug)]
pub(crate) struct InFlightGuard {
    owner: Arc<InFlight>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.owner.current.fetch_sub(1, Ordering::AcqRel);
        #[cfg(test)]
        self.owner.finished.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_counts_until_dropped() {
        let f = Arc::new(InFlight::default());
        assert_eq!(f.current(), 0);
        let g1 = f.begin();
        let g2 = f.begin();
        assert_eq!(f.current(), 2);
        drop(g1);
        assert_eq!(f.current(), 1);
        drop(g2);
        assert_eq!(f.current(), 0);
        assert_eq!(f.finished(), 2);
    }

    #[test]
    fn dropping_the_future_that_holds_a_guard_finishes_it() {
        let f = Arc::new(InFlight::default());
        let fut = {
            let g = f.begin();
            async move {
                let _g = g;
                std::future::pending::<()>().await;
            }
        };
        assert_eq!(f.current(), 1);
        drop(fut);
        assert_eq!(f.current(), 0);
    }
}
