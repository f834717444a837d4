//! Deadlines that tell "the work took too long" from "this process was not running".
//!
//! A coordinator stopped with SIGSTOP (or paused by its host) and resumed finds every timer expired at once: a
//! request that arrived just before the stop, or a mutex wait that was in progress, would fail with
//! `STORE_UNAVAILABLE` ("timed out") although Redis and the work were never slow. A timer that fires well after
//! its deadline proves only that the runtime did not run at the deadline, so such an expiry is forgiven once: the
//! work gets one more full limit from the moment the process runs again. A deadline that fires on time is final.
//!
//! Time comes from `tokio::time`, so the tests pause and advance it.

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// How late a timer may fire and still count as on time. Beyond it the process was not running at the deadline
/// (a scheduler under load delays timers by milliseconds; a stop delays them by the stop's length).
pub const STALL_SLACK: Duration = Duration::from_millis(250);

/// A deadline `limit` from its start, forgiven once if it is found passed long after it passed.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    limit: Duration,
    forgiven: bool,
}

impl Deadline {
    /// A deadline `limit` from now.
    pub fn after(limit: Duration) -> Self {
        Deadline {
            at: Instant::now() + limit,
            limit,
            forgiven: false,
        }
    }

    /// When it falls due now.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// Whether the deadline has passed for good. A deadline first found passed more than [`STALL_SLACK`] after it
    /// fell due was missed because this process was not running: it moves to one `limit` from now, once.
    pub fn passed(&mut self) -> bool {
        let now = Instant::now();
        if now < self.at {
            return false;
        }
        if !self.forgiven && now.duration_since(self.at) > STALL_SLACK {
            self.forgiven = true;
            self.at = now + self.limit;
            return false;
        }
        true
    }
}

/// The deadline of [`within`] passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// Runs `work` for at most `limit`, forgiving one expiry that a stop of this process caused (see the module
/// docs).
///
/// # Errors
/// [`Elapsed`] when the deadline passed while the process ran.
///
/// # Cancel safety
/// Dropping the returned future drops `work`.
pub async fn within<F: Future>(limit: Duration, work: F) -> Result<F::Output, Elapsed> {
    let mut deadline = Deadline::after(limit);
    tokio::pin!(work);
    loop {
        tokio::select! {
            biased;
            out = &mut work => return Ok(out),
            _ = tokio::time::sleep_until(deadline.at()) => {
                if deadline.passed() {
                    return Err(Elapsed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn work_that_overruns_while_the_process_runs_times_out() {
        let slow = tokio::time::sleep(Duration::from_secs(6));
        assert_eq!(within(Duration::from_secs(5), slow).await, Err(Elapsed));
    }

    #[tokio::test(start_paused = true)]
    async fn an_expiry_that_a_stop_caused_is_forgiven_once() {
        // The work needs 1 s; the process is stopped for 10 s in between (every timer fires late at once).
        let work = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            // While stopped, no task ran: the clock jumps past the deadline and the sleep below.
            tokio::time::advance(Duration::from_secs(10)).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            7
        };
        assert_eq!(within(Duration::from_secs(5), work).await, Ok(7));
    }

    #[test]
    fn a_deadline_found_late_moves_once_and_one_found_on_time_is_final() {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(async {
                let mut d = Deadline::after(Duration::from_secs(1));
                assert!(!d.passed());
                tokio::time::advance(Duration::from_secs(1) + STALL_SLACK / 2).await;
                assert!(d.passed(), "found on time: final");

                let mut d = Deadline::after(Duration::from_secs(1));
                tokio::time::advance(Duration::from_secs(30)).await;
                assert!(!d.passed(), "found 29 s late: the process was stopped");
                tokio::time::advance(Duration::from_secs(1)).await;
                assert!(d.passed(), "the second limit is final");
                tokio::time::advance(Duration::from_secs(30)).await;
                assert!(d.passed(), "forgiven only once");
            });
    }
}
