//! A rate limiter for log lines of repeated events: at most one line per key per window, and the next admitted
//! line says how many were suppressed in between.
//!
//! Repeated refusals (a client heartbeating a lost group every second, a fleet of them) would otherwise write a
//! line or two per request: the log says nothing new after the first line, and drowns the lines that do.
//! Counters and metrics still count every event; only the text is thinned.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Key under which events are limited together once the limiter tracks `max_keys` keys.
const OVERFLOW_KEY: &str = "\u{0}overflow";

/// At most one admitted event per key and window; memory bounded by `max_keys` keys.
#[derive(Debug)]
pub struct LogLimiter {
    window: Duration,
    max_keys: usize,
    keys: Mutex<HashMap<String, Window>>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    /// Events of this key are suppressed until then.
    until: Instant,
    /// Events suppressed since the last admitted one.
    suppressed: u64,
}

impl LogLimiter {
    /// A limiter admitting one event per key per `window`, tracking at most `max_keys` keys (more share one
    /// window, so an unbounded key space cannot grow the map or escape the limit).
    pub fn new(window: Duration, max_keys: usize) -> Self {
        LogLimiter {
            window,
            max_keys: max_keys.max(1),
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// Whether to log an event of `key` now: `Some(n)` to log it (`n` events of the key were suppressed since the
    /// last logged one), `None` to drop it.
    pub fn admit(&self, key: &str) -> Option<u64> {
        self.admit_at(key, Instant::now())
    }

    /// [`Self::admit`] at a given instant.
    pub fn admit_at(&self, key: &str, now: Instant) -> Option<u64> {
        // A poisoned lock only means another thread panicked while logging: keep limiting with its data.
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let key = if keys.contains_key(key) || keys.len() < self.max_keys {
            key
        } else {
            keys.retain(|_, w| w.until > now);
            if keys.len() < self.max_keys {
                key
            } else {
                OVERFLOW_KEY
            }
        };
        match keys.get_mut(key) {
            Some(w) if now < w.until => {
                w.suppressed += 1;
                None
            }
            Some(w) => {
                let suppressed = w.suppressed;
                *w = Window {
                    until: now + self.window,
                    suppressed: 0,
                };
                Some(suppressed)
            }
            None => {
                keys.insert(
                    key.to_owned(),
                    Window {
                        until: now + self.window,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(10);

    #[test]
    fn one_line_per_key_and_window_then_the_suppressed_count() {
        let limiter = LogLimiter::new(W, 16);
        let t0 = Instant::now();
        assert_eq!(limiter.admit_at("a", t0), Some(0));
        for i in 1..=5 {
            assert_eq!(limiter.admit_at("a", t0 + Duration::from_secs(i)), None);
        }
        assert_eq!(limiter.admit_at("b", t0), Some(0), "keys are limited separately");
        assert_eq!(limiter.admit_at("a", t0 + W), Some(5));
        assert_eq!(limiter.admit_at("a", t0 + W + Duration::from_secs(1)), None);
        assert_eq!(limiter.admit_at("a", t0 + W * 2), Some(1));
    }

    #[test]
    fn many_keys_share_one_window_instead_of_growing_the_map() {
        let limiter = LogLimiter::new(W, 4);
        let t0 = Instant::now();
        let admitted = (0..1000)
            .filter(|i| limiter.admit_at(&format!("k{i}"), t0).is_some())
            .count();
        assert_eq!(admitted, 5, "4 tracked keys and one shared overflow window");
        assert!(limiter.keys.lock().unwrap().len() <= 5);
        // Expired windows make room for new keys again.
        assert_eq!(limiter.admit_at("fresh", t0 + W), Some(0));
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_runs_on_tokio_time() {
        let limiter = LogLimiter::new(W, 16);
        assert_eq!(limiter.admit("a"), Some(0));
        tokio::time::advance(W - Duration::from_millis(1)).await;
        assert_eq!(limiter.admit("a"), None, "still inside the window");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            limiter.admit("a"),
            Some(1),
            "the next window, with the suppressed count"
        );
    }
}
