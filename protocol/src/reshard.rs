//! The records of a stream's growth (see [`docs/resharding.md`]): what the routing remembers of each add-shards
//! (the seal position of every parent shard) and what a group remembers of the growths it adopted (which parents
//! it has drained up to their seal).
//!
//! Both are plain data checked on decode; the rules that move them are the coordinator's
//! (`coord-server/src/state_machine/reshard.rs`).
//!
//! [`docs/resharding.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/resharding.md

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use crate::version::{RoutingVersion, ShardId};

/// Most growths a routing remembers. Older ones are dropped; a group that has not adopted the routing since
/// before the oldest remembered growth cannot learn its seals and refuses to adopt (fails closed).
pub const MAX_RECORDED_GROWTHS: usize = 64;

/// A Redis stream entry id `<ms>-<seq>`, ordered as Redis orders them.
///
/// ```
/// use protocol::EntryId;
///
/// let id: EntryId = "1700000000000-2".parse()?;
/// assert_eq!((id.ms, id.seq), (1_700_000_000_000, 2));
/// assert!(id > EntryId::ZERO);
/// assert_eq!(id.to_string(), "1700000000000-2");
/// assert!("not-an-id".parse::<EntryId>().is_err());
/// # Ok::<(), protocol::reshard::EntryIdError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryId {
    /// Milliseconds part.
    pub ms: u64,
    /// Sequence part.
    pub seq: u64,
}

impl EntryId {
    /// `0-0`: the position of an empty stream.
    pub const ZERO: EntryId = EntryId { ms: 0, seq: 0 };

    /// `<ms>-<seq>` read straight from a reply's bytes (no copy, no UTF-8 check, no `String`): every entry read
    /// and every record written carries one. Strict, and the rule [`FromStr`] uses too: two canonical decimals (no
    /// sign, no leading zero, nothing around them) of at most 20 digits that fit a `u64`.
    #[inline]
    pub fn from_bytes(raw: &[u8]) -> Option<EntryId> {
        fn part(p: &[u8]) -> Option<u64> {
            if p.is_empty() || p.len() > 20 || (p.len() > 1 && p[0] == b'0') {
                return None;
            }
            p.iter().try_fold(0u64, |n, &b| {
                let digit = b.wrapping_sub(b'0');
                if digit > 9 {
                    return None;
                }
                n.checked_mul(10)?.checked_add(u64::from(digit))
            })
        }
        let dash = raw.iter().position(|&b| b == b'-')?;
        Some(EntryId {
            ms: part(&raw[..dash])?,
            seq: part(&raw[dash + 1..])?,
        })
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// Why a text is not an entry id.
///
/// ```
/// use protocol::EntryId;
///
/// let e = "12-x".parse::<EntryId>().unwrap_err();
/// eprintln!("refused: {e}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryIdError(pub String);

impl fmt::Display for EntryIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a stream entry id (<ms>-<seq>)", self.0)
    }
}

impl std::error::Error for EntryIdError {}

impl FromStr for EntryId {
    type Err = EntryIdError;

    /// Strict, as [`EntryId::from_bytes`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EntryId::from_bytes(s.as_bytes()).ok_or_else(|| EntryIdError(s.chars().take(48).collect()))
    }
}

impl Serialize for EntryId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EntryId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What one shard's record (its fence hash, beside the shard stream) says of its birth: written once by the
/// coordinator when a layout creates the shard, read back to tell which growth a shard belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Birth {
    /// The shard.
    pub shard: ShardId,
    /// The routing version whose layout created it.
    pub born: RoutingVersion,
    /// The shard count before that growth (0 for a stream's first shards).
    pub parents: u32,
    /// The shard count of the layout that created it (`bornCount`; 0: a record written before counts were).
    pub count: u32,
}

/// One add-shards, as the stream routing records it.
///
/// Every shard below `parents` is a parent (with jump hash any old shard can send keys to any new one); every
/// shard from `parents` to `shard_count` is a child. A parent's seal is recorded once the seal script ran on it:
/// from then on its fence refuses producers older than `routing_version`, so every entry after the seal position
/// was written by a producer that routes with this growth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Growth {
    /// The routing version the growth created.
    pub routing_version: RoutingVersion,
    /// Shard count before the growth: shards `0..parents` are the parents.
    pub parents: u32,
    /// Shard count after it: shards `parents..shard_count` are the children.
    pub shard_count: u32,
    /// Seal position of each sealed parent; a parent missing here is still to be sealed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub seals: BTreeMap<ShardId, EntryId>,
}

impl Growth {
    /// Whether every parent is sealed.
    pub fn sealed(&self) -> bool {
        self.seals.len() == self.parents as usize
    }

    /// Parents not sealed yet.
    pub fn unsealed(&self) -> impl Iterator<Item = ShardId> + '_ {
        (0..self.parents).map(ShardId).filter(|p| !self.seals.contains_key(p))
    }

    /// Checks the record's own rules.
    ///
    /// # Errors
    /// A sentence naming the broken rule.
    pub fn check(&self) -> Result<(), String> {
        if self.parents == 0 || self.parents >= self.shard_count {
            return Err(format!(
                "growth {} has {} parents and {} shards",
                self.routing_version, self.parents, self.shard_count
            ));
        }
        if let Some((p, _)) = self.seals.iter().find(|(p, _)| p.0 >= self.parents) {
            return Err(format!("growth {} seals shard {p}, not a parent", self.routing_version));
        }
        Ok(())
    }
}

/// One growth a group has adopted and not finished: its children are held (assigned but never readable) until
/// the group has drained every parent up to its seal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupReshard {
    /// The growth's routing version.
    pub routing_version: RoutingVersion,
    /// Shards `0..parents` are the parents.
    pub parents: u32,
    /// Shards `parents..shard_count` are the children.
    pub shard_count: u32,
    /// The seal positions the group knows (copied from the routing as they are recorded).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub seals: BTreeMap<ShardId, EntryId>,
    /// Parents the coordinator observed drained by this group up to the seal recorded here.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub drained: BTreeSet<ShardId>,
    /// Redis time (ms) the group adopted the growth (its children's wait started).
    pub since_ms: u64,
}

impl GroupReshard {
    /// Whether `shard` is one of this growth's children.
    pub fn is_child(&self, shard: ShardId) -> bool {
        shard.0 >= self.parents && shard.0 < self.shard_count
    }

    /// Whether every parent is drained.
    pub fn done(&self) -> bool {
        self.drained.len() == self.parents as usize
    }

    /// Checks the record's own rules against the group's shard count.
    ///
    /// # Errors
    /// A sentence naming the broken rule.
    pub fn check(&self, group_shards: u32) -> Result<(), String> {
        let v = self.routing_version;
        if self.parents == 0 || self.parents >= self.shard_count || self.shard_count > group_shards {
            return Err(format!(
                "reshard {v} has {} parents and {} shards (the group has {group_shards})",
                self.parents, self.shard_count
            ));
        }
        if let Some(p) = self
            .seals
            .keys()
            .chain(self.drained.iter())
            .find(|p| p.0 >= self.parents)
        {
            return Err(format!("reshard {v} records shard {p}, not a parent"));
        }
        if let Some(p) = self.drained.iter().find(|p| !self.seals.contains_key(p)) {
            return Err(format!("reshard {v} has parent {p} drained without a seal"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_parse_strictly_and_order_as_redis() {
        let a: EntryId = "1700000000000-3".parse().unwrap();
        assert_eq!(
            a,
            EntryId {
                ms: 1_700_000_000_000,
                seq: 3
            }
        );
        assert_eq!(a.to_string(), "1700000000000-3");
        assert!(EntryId::ZERO < a);
        assert!("1-10".parse::<EntryId>().unwrap() > "1-9".parse().unwrap());
        for bad in [
            "",
            "1",
            "-1",
            "1-",
            "01-1",
            "1-01",
            "+1-1",
            "1-1-1",
            "a-1",
            "99999999999999999999-0",
        ] {
            assert!(bad.parse::<EntryId>().is_err(), "{bad}");
        }
        for raw in [
            "-",
            "1-+0",
            " 1-0",
            "1-0 ",
            "1-0\n",
            "1--2",
            "1-b",
            "18446744073709551616-0",
            "0-18446744073709551616",
            "000000000000000000001-0",
            "\u{661}-0",
        ] {
            assert!(raw.parse::<EntryId>().is_err(), "{raw:?}");
        }
        assert_eq!(EntryId::from_bytes(b"\xff-0"), None, "not UTF-8");
        for (raw, ms, seq) in [
            ("0-0", 0, 0),
            ("0-9", 0, 9),
            ("18446744073709551615-18446744073709551615", u64::MAX, u64::MAX),
        ] {
            assert_eq!(EntryId::from_bytes(raw.as_bytes()), Some(EntryId { ms, seq }), "{raw}");
        }
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"1700000000000-3\"");
        assert!(serde_json::from_str::<EntryId>("\"x\"").is_err());
    }

    #[test]
    fn growth_and_reshard_rules() {
        let mut g = Growth {
            routing_version: RoutingVersion(2),
            parents: 2,
            shard_count: 4,
            seals: BTreeMap::new(),
        };
        assert!(g.check().is_ok());
        assert_eq!(g.unsealed().collect::<Vec<_>>(), vec![ShardId(0), ShardId(1)]);
        g.seals.insert(ShardId(2), EntryId::ZERO);
        assert!(g.check().is_err());
        let mut r = GroupReshard {
            routing_version: RoutingVersion(2),
            parents: 2,
            shard_count: 4,
            seals: BTreeMap::new(),
            drained: BTreeSet::new(),
            since_ms: 0,
        };
        assert!(r.check(4).is_ok());
        assert!(r.check(3).is_err());
        assert!(r.is_child(ShardId(2)) && r.is_child(ShardId(3)) && !r.is_child(ShardId(1)));
        r.drained.insert(ShardId(0));
        assert!(r.check(4).unwrap_err().contains("without a seal"));
    }
}
