//! What happens to an entry after a handler attempt: acknowledged, dead-lettered, or retried after a delay.
//! Pure: the reader runs the handler, sleeps and talks to Redis; this decides.

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use std::any::Any;
use std::time::Duration;

use crate::error::HandlerError;
use crate::outcome::{Outcome, MAX_RETRY_DELAY};

/// A jittered exponential backoff without an attempt limit.
pub(crate) fn jittered(min: Duration, max: Duration) -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_jitter()
        // backon without its `std` feature seeds every generator alike; readers must not retry in lockstep.
        .with_jitter_seed(rand::random())
        .without_max_times()
        .build()
}

/// How one handler attempt ended (the handler's result, or its panic).
pub(crate) type AttemptResult = Result<Result<(), HandlerError>, Box<dyn Any + Send>>;

/// What to do with the entry after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Handled: acknowledge it.
    Acknowledge,
    /// The handler asked for it: move it to the dead-letter stream with this reason.
    DeadLetter(String),
    /// It failed its last allowed delivery (`max_deliveries`): move it to the dead-letter stream with this error.
    Exhausted(String),
    /// Deliver it again after `delay` (counted as a delivery); `error` is what failed.
    Retry { delay: Duration, error: String },
}

/// The retry policy of one entry: its delivery limit and its own backoff (reset for every entry).
#[derive(Debug)]
pub(crate) struct Retries {
    max_deliveries: u32,
    min: Duration,
    max: Duration,
    backoff: Option<ExponentialBackoff>,
}

impl Retries {
    pub(crate) fn new(max_deliveries: u32, min: Duration, max: Duration) -> Self {
        Retries {
            max_deliveries,
            min,
            max,
            backoff: None,
        }
    }

    /// Before an attempt: the dead-letter reason if the entry was already delivered more than `max_deliveries`
    /// times (by earlier owners, or retries recorded in Redis), so the handler is not run again.
    pub(crate) fn exhausted(&self, delivery_count: u32) -> Option<String> {
        (delivery_count > self.max_deliveries).then(|| {
            format!(
                "delivered {delivery_count} times, more than max_deliveries ({})",
                self.max_deliveries
            )
        })
    }

    /// After the attempt of delivery number `delivery_count` ended with `result`.
    pub(crate) fn decide(&mut self, delivery_count: u32, result: AttemptResult) -> Decision {
        let (error, requested) = match result {
            Ok(Ok(())) => return Decision::Acknowledge,
            Ok(Err(e)) => match e.downcast_ref::<Outcome>() {
                Some(Outcome::DeadLetter(why)) => return Decision::DeadLetter(why.clone()),
                Some(Outcome::RetryAfter(d)) => (e.to_string(), Some((*d).min(MAX_RETRY_DELAY))),
                None => (e.to_string(), None),
            },
            Err(panic) => (panic_message(panic), None),
        };
        if delivery_count >= self.max_deliveries {
            return Decision::Exhausted(error);
        }
        let delay = match requested {
            Some(d) => d,
            None => self
                .backoff
                .get_or_insert_with(|| jittered(self.min, self.max))
                .next()
                .unwrap_or(self.max),
        };
        Decision::Retry { delay, error }
    }
}

/// The message of a handler's panic, for the log and the dead-letter entry.
pub(crate) fn panic_message(panic: Box<dyn Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("handler panicked: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("handler panicked: {s}")
    } else {
        "handler panicked".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn failed(msg: &str) -> AttemptResult {
        Ok(Err(msg.to_owned().into()))
    }

    fn outcome(o: Outcome) -> AttemptResult {
        Ok(Err(o.into()))
    }

    #[test]
    fn success_is_acknowledged_whatever_the_delivery_count() {
        let mut r = Retries::new(3, 10 * MS, 100 * MS);
        assert_eq!(r.decide(1, Ok(Ok(()))), Decision::Acknowledge);
        assert_eq!(r.decide(3, Ok(Ok(()))), Decision::Acknowledge);
    }

    #[test]
    fn a_failure_is_retried_with_backoff_until_the_last_delivery_then_dead_lettered() {
        let mut r = Retries::new(3, 10 * MS, 40 * MS);
        for count in 1..3 {
            match r.decide(count, failed("boom")) {
                Decision::Retry { delay, error } => {
                    assert_eq!(error, "boom");
                    // Jitter adds up to the delay itself on top of it.
                    assert!(delay >= 10 * MS && delay <= 80 * MS, "{delay:?}");
                }
                other => panic!("delivery {count}: {other:?}"),
            }
        }
        assert_eq!(
            r.decide(3, failed("boom")),
            Decision::Exhausted("boom".into()),
            "the max_deliveries-th failure is the last"
        );
    }

    #[test]
    fn the_backoff_grows_and_is_capped() {
        let mut r = Retries::new(100, 10 * MS, 40 * MS);
        let delays: Vec<Duration> = (1..30)
            .map(|n| match r.decide(n, failed("x")) {
                Decision::Retry { delay, .. } => delay,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(delays.iter().all(|d| *d <= 80 * MS), "capped (plus jitter): {delays:?}");
        assert!(
            delays[10..].iter().all(|d| *d >= 40 * MS),
            "grown to the cap: {delays:?}"
        );
    }

    #[test]
    fn an_entry_delivered_too_often_is_dead_lettered_before_the_handler_runs() {
        let r = Retries::new(3, 10 * MS, 40 * MS);
        assert_eq!(r.exhausted(3), None, "the third delivery still runs");
        assert_eq!(
            r.exhausted(4).as_deref(),
            Some("delivered 4 times, more than max_deliveries (3)")
        );
    }

    #[test]
    fn the_handler_chooses_dead_letter_or_its_own_delay() {
        let mut r = Retries::new(3, 10 * MS, 40 * MS);
        assert_eq!(
            r.decide(1, outcome(Outcome::DeadLetter("bad amount".into()))),
            Decision::DeadLetter("bad amount".into()),
            "at once, whatever the count"
        );
        assert!(matches!(
            r.decide(1, outcome(Outcome::RetryAfter(5000 * MS))),
            Decision::Retry { delay, .. } if delay == 5000 * MS
        ));
        assert!(
            matches!(
                r.decide(1, outcome(Outcome::RetryAfter(MAX_RETRY_DELAY * 2))),
                Decision::Retry { delay, .. } if delay == MAX_RETRY_DELAY
            ),
            "cut to the longest honoured delay"
        );
        assert!(
            matches!(r.decide(3, outcome(Outcome::RetryAfter(MS))), Decision::Exhausted(_)),
            "a requested retry still counts against max_deliveries"
        );
    }

    #[test]
    fn a_panic_is_a_failure_with_its_message() {
        let mut r = Retries::new(1, 10 * MS, 40 * MS);
        assert_eq!(
            r.decide(1, Err(Box::new("oops"))),
            Decision::Exhausted("handler panicked: oops".into())
        );
        assert_eq!(
            r.decide(1, Err(Box::new(String::from("owned")))),
            Decision::Exhausted("handler panicked: owned".into())
        );
        assert_eq!(
            r.decide(1, Err(Box::new(42u8))),
            Decision::Exhausted("handler panicked".into())
        );
    }
}
