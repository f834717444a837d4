//! Whether a reader can reach Redis, shared with the supervisor.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Whether a reader can reach Redis, shared with the supervisor: a member whose reader has failed to read for
/// longer than [`Timings::read_failure_timeout`](crate::Timings::read_failure_timeout) gives its shards back.
#[derive(Debug, Default)]
pub(crate) struct ReadHealth {
    /// Since when every Redis command of the reader failed; `None` after a success.
    failing_since: Mutex<Option<Instant>>,
}

impl ReadHealth {
    /// How long the reader has been failing at `now`, if it is.
    pub(crate) fn failing_for(&self, now: Instant) -> Option<Duration> {
        self.lock().map(|since| now.saturating_duration_since(since))
    }

    /// Records a failure at `now` (the first of a run) or a success (`None`).
    pub(crate) fn set(&self, failing_since: Option<Instant>) {
        *self.lock() = failing_since;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.failing_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_time_counts_from_the_first_failure_until_a_success() {
        let t0 = Instant::now();
        let h = ReadHealth::default();
        assert_eq!(h.failing_for(t0), None);
        h.set(Some(t0));
        assert_eq!(h.failing_for(t0 + Duration::from_secs(3)), Some(Duration::from_secs(3)));
        h.set(None);
        assert_eq!(h.failing_for(t0 + Duration::from_secs(4)), None);
    }
}
