//! Where the shells read time, so their intervals can be tested with Tokio's paused time.
//!
//! Intervals and throttles ([`LastRun`]) are on Tokio's clock: in production it is the monotonic clock, under
//! `#[tokio::test(start_paused = true)]` it moves only with `tokio::time::advance`. The coordinator's decisions
//! never use either: the state machine gets Redis `TIME`, loaded with the metadata (see [`crate::store`]), so
//! every instance judges by one clock. The only wall-clock reading left, [`unix_ms`], labels events for display.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// When a periodic job last ran (a rebuild, a recheck, a scrape), on Tokio's clock.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LastRun(Option<Instant>);

impl LastRun {
    /// Whether it ever ran.
    pub fn ever(self) -> bool {
        self.0.is_some()
    }

    /// Whether `period` has passed since it last ran, or it never ran.
    pub fn due(self, period: Duration) -> bool {
        self.0.is_none_or(|t| t.elapsed() >= period)
    }

    /// Records that it runs now.
    pub fn mark(&mut self) {
        self.0 = Some(Instant::now());
    }
}

/// The wall clock in ms since the Unix epoch: for display only (status page timestamps), never for a decision.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn due_when_it_never_ran_and_again_one_period_after_it_ran() {
        let mut last = LastRun::default();
        assert!(!last.ever());
        assert!(last.due(PERIOD), "a job that never ran is due");
        last.mark();
        assert!(last.ever());
        assert!(!last.due(PERIOD));
        tokio::time::advance(PERIOD - Duration::from_millis(1)).await;
        assert!(!last.due(PERIOD), "not before the period is over");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(last.due(PERIOD));
        last.mark();
        assert!(!last.due(PERIOD), "a new run starts a new period");
    }
}
