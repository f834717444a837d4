//! A token bucket: `rate` requests per second, at most `burst` at once. Time comes from `tokio::time`, so tests
//! pause and advance it instead of sleeping.

use std::time::Duration;
use tokio::time::Instant;

/// One token's bucket on this replica.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket.
    pub fn new(rate: u32, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Bucket {
            rate: f64::from(rate.max(1)),
            burst,
            tokens: burst,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = now;
    }

    /// Takes one request's token at `now`, or says how long until one is there.
    ///
    /// # Errors
    /// The wait until the next token (at least 1 ms).
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        // The epsilon absorbs the rounding of many small refills, so a token due now is never refused.
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            return Ok(());
        }
        let wait = (1.0 - self.tokens) / self.rate;
        Err(Duration::from_secs_f64(wait).max(Duration::from_millis(1)))
    }

    /// Whole tokens left at `now`.
    pub fn available(&mut self, now: Instant) -> u32 {
        self.refill(now);
        // Within 0..=burst, which came from a u32.
        self.tokens.floor() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rate_holds() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10, 5, t0);
        for _ in 0..5 {
            assert!(b.take(t0).is_ok());
        }
        let wait = b.take(t0).expect_err("the burst is spent");
        assert_eq!(wait, Duration::from_millis(100), "one token every 1/10 s");
        assert!(b.take(t0 + Duration::from_millis(99)).is_err());
        assert!(b.take(t0 + Duration::from_millis(100)).is_ok());
        assert_eq!(
            b.available(t0 + Duration::from_secs(60)),
            5,
            "never more than the burst"
        );
    }
}
