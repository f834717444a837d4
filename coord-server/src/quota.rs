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
//!   create and recreate (so every replica counts the same), under the token's group-create mutex in Redis, held
//!   from the count until the new group is indexed (`coordinator/quota/lock.rs`): concurrent creates of one token,
//!   over any replicas, stop at the quota;
//! * shards per group: the shard count of the stream a group reads, at create (the stream's stored count, or the
//!   create's) and at add-shards, where [`TokenQuota::check_growth`] runs in the routing section's decision, under
//!   the stream's routing mutex: the count checked is the count grown, so concurrent add-shards stop at the quota;
//! * members per group: at join, inside the group's critical section, by the pure core
//!   (`state_machine::quota`): a join past it is refused and writes nothing;
//! * request rate: before the request's body is read, per replica (N replicas admit up to N times the rate).

pub mod bucket;
pub mod principals;

use protocol::metadata::MAX_SHARDS;
use protocol::names::StreamName;
use protocol::Status;
use std::fmt;

use crate::error::Error;
use crate::stats::Stats;

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

/// A token's name and limits, as a request carries them into the operation that spends them (owned: a mutation
/// runs in a task of its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenQuota {
    /// The token's name (`principals::Principal::name`): it names the token in refusals and its mutex in Redis.
    pub name: String,
    /// Its limits.
    pub quota: Quota,
}

impl TokenQuota {
    /// Refuses growing `stream` from `current` shards by `count` past this token's shard quota, counted. Call it
    /// where the growth is decided, on the count it grows from. A total no stream may have is left to the growth
    /// to refuse (a `400`: no quota would ever admit it).
    ///
    /// # Errors
    /// `QUOTA_EXCEEDED`.
    pub(crate) fn check_growth(
        &self,
        stats: &Stats,
        stream: &StreamName,
        current: u32,
        count: u32,
    ) -> Result<(), Error> {
        let limit = self.quota.shards_per_group;
        let after = u64::from(current) + u64::from(count);
        if after > u64::from(limit) && after <= u64::from(MAX_SHARDS) {
            return Err(exceeded(
                stats,
                "shards",
                format!(
                    "stream {stream} would grow from {current} to {after} shards, token {}'s quota allows {limit} per \
                     group: no shard was added",
                    self.name
                ),
            ));
        }
        Ok(())
    }
}

/// A `QUOTA_EXCEEDED` refusal of the `quota` named (`groups`, `shards`, `members`), counted.
pub(crate) fn exceeded(stats: &Stats, quota: &'static str, message: String) -> Error {
    stats.metrics().quota_refused(quota);
    Error::Rejected {
        status: Status::QuotaExceeded,
        message,
        member_epoch: None,
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
    fn a_growth_is_refused_past_the_shard_quota_only() {
        let who = TokenQuota {
            name: "tenant-a-admin".into(),
            quota: Quota {
                shards_per_group: 16,
                ..Quota::default()
            },
        };
        let (stats, stream) = (Stats::default(), StreamName::new("s").expect("stream"));
        assert!(who.check_growth(&stats, &stream, 15, 1).is_ok(), "up to the quota");
        match who.check_growth(&stats, &stream, 16, 1) {
            Err(Error::Rejected { status, message, .. }) => {
                assert_eq!(status, Status::QuotaExceeded);
                assert!(
                    message.contains("16 to 17") && message.contains("tenant-a-admin"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Past what any stream may have: the growth's own 400, not a 429 that invites a retry.
        assert!(who.check_growth(&stats, &stream, 1, MAX_SHARDS).is_ok());
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
