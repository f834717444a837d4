//! Quotas per token: how many groups a token may create, how many shards a group's stream and how many members a
//! group may hold, and how many requests per second it may send. Why these limits and how their defaults were
//! sized is in `docs/operations.md`, "Quotas".
//!
//! # Layout
//! * this file: the limits ([`Quota`]), the per-token overrides of a token table line ([`QuotaOverrides`]).
//! * [`bucket`]: the request-rate token bucket (one per token, per coordinator replica).
//! * [`principals`]: who a request speaks for (its token's name and quota), built once from the configuration.
//!
//! What each quota counts, and where it is checked:
//! * groups: the groups on the streams the token's prefixes reach, counted from the groups index in Redis at
//!   create (so every replica counts the same); a concurrent create by the same token may overshoot by the
//!   creates in flight;
//! * shards per group: the shard count of the stream a group reads, at create and at add-shards;
//! * members per group: at join, inside the group's critical section, by the pure core
//!   (`state_machine::quota`): a join past it is refused and writes nothing;
//! * request rate: before the request's body is read, per replica (N replicas admit up to N times the rate).

pub mod bucket;
pub mod principals;

use std::fmt;

/// The limits of one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Groups on the streams the token reaches.
    pub groups: u32,
    /// Shards of the stream a group reads.
    pub shards_per_group: u32,
    /// Members of one group.
    pub members_per_group: u32,
    /// Requests per second, refilled continuously.
    pub requests_per_second: u32,
    /// Requests the token may send at once after being idle.
    pub request_burst: u32,
}

impl Default for Quota {
    /// Sized from `BENCHMARKS.md` (reasoning in `docs/operations.md`, "Quotas").
    fn default() -> Self {
        Quota {
            groups: 100,
            shards_per_group: 1024,
            members_per_group: 1024,
            requests_per_second: 1000,
            request_burst: 2000,
        }
    }
}

impl Quota {
    /// Checks that every limit is usable.
    ///
    /// # Errors
    /// A sentence naming the limit that is zero or out of range.
    pub fn validate(&self) -> Result<(), String> {
        for (name, value) in [
            ("groups", self.groups),
            ("shards", self.shards_per_group),
            ("members", self.members_per_group),
            ("rate", self.requests_per_second),
            ("burst", self.request_burst),
        ] {
            if value == 0 {
                return Err(format!("quota {name} must be at least 1"));
            }
        }
        if self.shards_per_group > protocol::metadata::MAX_SHARDS {
            return Err(format!(
                "quota shards must be at most {} (the most a stream can have)",
                protocol::metadata::MAX_SHARDS
            ));
        }
        Ok(())
    }

    /// These limits with `overrides` applied.
    pub fn with(mut self, overrides: &QuotaOverrides) -> Quota {
        let QuotaOverrides {
            groups,
            shards_per_group,
            members_per_group,
            requests_per_second,
            request_burst,
        } = *overrides;
        self.groups = groups.unwrap_or(self.groups);
        self.shards_per_group = shards_per_group.unwrap_or(self.shards_per_group);
        self.members_per_group = members_per_group.unwrap_or(self.members_per_group);
        self.requests_per_second = requests_per_second.unwrap_or(self.requests_per_second);
        self.request_burst = request_burst.unwrap_or(self.request_burst);
        self
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "groups={} shards={} members={} rate={} burst={}",
            self.groups, self.shards_per_group, self.members_per_group, self.requests_per_second, self.request_burst
        )
    }
}

/// The limits one token table line sets for its token (`groups=10 rate=50`); unset ones keep the defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaOverrides {
    /// `groups=N`.
    pub groups: Option<u32>,
    /// `shards=N`.
    pub shards_per_group: Option<u32>,
    /// `members=N`.
    pub members_per_group: Option<u32>,
    /// `rate=N` (requests per second).
    pub requests_per_second: Option<u32>,
    /// `burst=N`.
    pub request_burst: Option<u32>,
}

/// The attribute keys a token table line may carry after its token.
pub const ATTRIBUTES: &str = "name=, groups=, shards=, members=, rate=, burst=";

impl QuotaOverrides {
    /// Sets the limit named `key` (one of [`ATTRIBUTES`] but `name`) to `value`. Returns `Ok(false)` for a key
    /// that is not a limit.
    ///
    /// # Errors
    /// A value that is not a positive integer, or a key given twice.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool, String> {
        let slot = match key {
            "groups" => &mut self.groups,
            "shards" => &mut self.shards_per_group,
            "members" => &mut self.members_per_group,
            "rate" => &mut self.requests_per_second,
            "burst" => &mut self.request_burst,
            _ => return Ok(false),
        };
        let n: u32 = value
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{key}= must be a whole number from 1 to {}", u32::MAX))?;
        if slot.is_some_and(|old| old != n) {
            return Err(format!("{key}= is given twice with different values for one token"));
        }
        *slot = Some(n);
        Ok(true)
    }

    /// Adds the limits of another line of the same token.
    ///
    /// # Errors
    /// A limit both lines set to different values.
    pub fn merge(&mut self, other: &QuotaOverrides) -> Result<(), String> {
        for (key, value) in [
            ("groups", other.groups),
            ("shards", other.shards_per_group),
            ("members", other.members_per_group),
            ("rate", other.requests_per_second),
            ("burst", other.request_burst),
        ] {
            if let Some(v) = value {
                self.set(key, &v.to_string())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_replace_only_what_they_set() {
        let mut o = QuotaOverrides::default();
        assert_eq!(o.set("groups", "3"), Ok(true));
        assert_eq!(o.set("rate", "50"), Ok(true));
        assert_eq!(o.set("color", "red"), Ok(false));
        let q = Quota::default().with(&o);
        assert_eq!((q.groups, q.requests_per_second), (3, 50));
        assert_eq!(q.shards_per_group, Quota::default().shards_per_group);
        for bad in ["0", "-1", "1.5", "", "99999999999"] {
            assert!(QuotaOverrides::default().set("members", bad).is_err(), "{bad}");
        }
        assert!(o.set("groups", "4").is_err(), "a second, different value");
        assert!(o.set("groups", "3").is_ok(), "the same value again");
    }

    #[test]
    fn zero_or_oversized_limits_are_refused() {
        assert!(Quota::default().validate().is_ok());
        let zero = Quota {
            request_burst: 0,
            ..Quota::default()
        };
        assert!(zero.validate().unwrap_err().contains("burst"));
        let huge = Quota {
            shards_per_group: protocol::metadata::MAX_SHARDS + 1,
            ..Quota::default()
        };
        assert!(huge.validate().is_err());
    }
}
