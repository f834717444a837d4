//! The cluster's slot map: which master serves which slots (`CLUSTER SLOTS`).

use std::fmt;

use redis::aio::ConnectionLike;
use redis::Value;

/// Most slot ranges a `CLUSTER SLOTS` answer may have (one per slot at worst).
const MAX_RANGES: usize = protocol::slot::SLOTS as usize;

/// A node's address, as the cluster announces it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeAddr {
    /// Host name or IP address.
    pub host: String,
    /// Port of its clients (not the cluster bus).
    pub port: u16,
}

impl NodeAddr {
    /// An address.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        NodeAddr {
            host: host.into(),
            port,
        }
    }

    /// Parses `host:port` (`[v6]:port` too), as `MOVED`/`ASK` and `CLUSTER NODES` write it.
    pub fn parse(text: &str) -> Option<Self> {
        let (host, port) = text.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return None;
        }
        Some(NodeAddr::new(host, port.parse().ok()?))
    }
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// The slot map could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// No node answered.
    #[error("no cluster node answered CLUSTER SLOTS: {0}")]
    Unreachable(#[source] redis::RedisError),
    /// An answer that is not a slot map.
    #[error("malformed CLUSTER SLOTS answer: {0}")]
    Malformed(&'static str),
    /// Some slots have no master (the cluster is down or still forming).
    #[error("{uncovered} of 16384 slots have no master")]
    Incomplete {
        /// Slots without a master.
        uncovered: usize,
    },
}

/// Which master serves each slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMap {
    /// Inclusive, non-overlapping ranges sorted by start.
    ranges: Vec<(u16, u16, NodeAddr)>,
}

impl SlotMap {
    /// A map from inclusive `(first, last, master)` ranges (in any order).
    ///
    /// # Errors
    /// Ranges that overlap, run past slot 16383, or leave a slot without a master.
    pub fn from_ranges(mut ranges: Vec<(u16, u16, NodeAddr)>) -> Result<Self, TopologyError> {
        ranges.sort_by_key(|r| r.0);
        let mut next = 0u32;
        let mut uncovered = 0usize;
        for (first, last, _) in &ranges {
            if first > last || u32::from(*last) >= u32::from(protocol::slot::SLOTS) {
                return Err(TopologyError::Malformed("slot range out of bounds"));
            }
            if u32::from(*first) < next {
                return Err(TopologyError::Malformed("slot ranges overlap"));
            }
            uncovered += (u32::from(*first) - next) as usize;
            next = u32::from(*last) + 1;
        }
        uncovered += (u32::from(protocol::slot::SLOTS) - next) as usize;
        if uncovered > 0 {
            return Err(TopologyError::Incomplete { uncovered });
        }
        Ok(SlotMap { ranges })
    }

    /// Reads the map with `CLUSTER SLOTS` on `conn`; `asked` is the address `conn` reaches (a node may announce
    /// itself with an empty host, meaning "the address you used").
    ///
    /// # Errors
    /// Redis errors; an answer that is not a full slot map.
    pub async fn fetch<C: ConnectionLike>(conn: &mut C, asked: Option<&NodeAddr>) -> Result<Self, TopologyError> {
        let reply: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(conn)
            .await
            .map_err(TopologyError::Unreachable)?;
        Self::from_reply(&reply, asked)
    }

    /// Parses a `CLUSTER SLOTS` answer.
    ///
    /// # Errors
    /// An answer that is not a full slot map.
    pub fn from_reply(reply: &Value, asked: Option<&NodeAddr>) -> Result<Self, TopologyError> {
        let Value::Array(entries) = reply else {
            return Err(TopologyError::Malformed("not an array"));
        };
        if entries.len() > MAX_RANGES {
            return Err(TopologyError::Malformed("more ranges than slots"));
        }
        let mut ranges = Vec::with_capacity(entries.len());
        for entry in entries {
            let Value::Array(fields) = entry else {
                return Err(TopologyError::Malformed("range is not an array"));
            };
            let (Some(first), Some(last), Some(Value::Array(master))) = (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err(TopologyError::Malformed("range without a master"));
            };
            let slot = |v: &Value| match v {
                Value::Int(n) => u16::try_from(*n).map_err(|_| TopologyError::Malformed("slot out of range")),
                _ => Err(TopologyError::Malformed("slot is not an integer")),
            };
            let host = match master.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => return Err(TopologyError::Malformed("master without a host")),
            };
            let port = match master.get(1) {
                Some(Value::Int(p)) => u16::try_from(*p).map_err(|_| TopologyError::Malformed("bad port"))?,
                _ => return Err(TopologyError::Malformed("master without a port")),
            };
            let host = match (host.as_str(), asked) {
                ("" | "?", Some(asked)) => asked.host.clone(),
                ("" | "?", None) => return Err(TopologyError::Malformed("master without a known host")),
                _ => host,
            };
            ranges.push((slot(first)?, slot(last)?, NodeAddr::new(host, port)));
        }
        Self::from_ranges(ranges)
    }

    /// The master serving `slot`.
    pub fn master_of(&self, slot: u16) -> &NodeAddr {
        let i = self.ranges.partition_point(|r| r.0 <= slot);
        // Complete by construction: range i-1 starts at or before `slot` and covers it.
        &self.ranges[i.saturating_sub(1)].2
    }

    /// The master serving `key`'s slot.
    pub fn master_of_key(&self, key: &[u8]) -> &NodeAddr {
        self.master_of(protocol::slot::key_slot(key))
    }

    /// Every master, once each, sorted.
    pub fn masters(&self) -> Vec<NodeAddr> {
        let mut masters: Vec<NodeAddr> = self.ranges.iter().map(|r| r.2.clone()).collect();
        masters.sort();
        masters.dedup();
        masters
    }

    /// The inclusive ranges, sorted by first slot.
    pub fn ranges(&self) -> &[(u16, u16, NodeAddr)] {
        &self.ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn range(first: i64, last: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
            Value::Array(vec![bulk("10.0.0.9"), Value::Int(9), bulk("replica")]),
        ])
    }

    #[test]
    fn a_full_answer_maps_every_slot_to_its_master() {
        let reply = Value::Array(vec![
            range(5461, 10922, "10.0.0.2", 7001),
            range(0, 5460, "", 7000),
            range(10923, 16383, "10.0.0.3", 7002),
        ]);
        let asked = NodeAddr::new("10.0.0.1", 7000);
        let map = SlotMap::from_reply(&reply, Some(&asked)).unwrap();
        assert_eq!(map.master_of(0), &asked);
        assert_eq!(map.master_of(5460), &asked);
        assert_eq!(map.master_of(5461).port, 7001);
        assert_eq!(map.master_of(16383).port, 7002);
        assert_eq!(map.masters().len(), 3);
        assert_eq!(map.master_of_key(b"foo"), map.master_of(12182));
    }

    #[test]
    fn gaps_overlaps_and_junk_are_refused() {
        let gap = Value::Array(vec![range(0, 100, "a", 1), range(200, 16383, "b", 2)]);
        assert!(matches!(
            SlotMap::from_reply(&gap, None),
            Err(TopologyError::Incomplete { uncovered: 99 })
        ));
        let overlap = Value::Array(vec![range(0, 100, "a", 1), range(100, 16383, "b", 2)]);
        assert!(matches!(
            SlotMap::from_reply(&overlap, None),
            Err(TopologyError::Malformed(_))
        ));
        let past = Value::Array(vec![range(0, 16384, "a", 1)]);
        assert!(matches!(
            SlotMap::from_reply(&past, None),
            Err(TopologyError::Malformed(_))
        ));
        assert!(SlotMap::from_reply(&Value::Nil, None).is_err());
        assert!(SlotMap::from_reply(&Value::Array(vec![Value::Int(1)]), None).is_err());
        let no_host = Value::Array(vec![range(0, 16383, "", 1)]);
        assert!(SlotMap::from_reply(&no_host, None).is_err());
    }

    #[test]
    fn addresses_parse_as_redirects_write_them() {
        assert_eq!(
            NodeAddr::parse("127.0.0.1:6379"),
            Some(NodeAddr::new("127.0.0.1", 6379))
        );
        assert_eq!(NodeAddr::parse("[::1]:7000"), Some(NodeAddr::new("::1", 7000)));
        assert_eq!(NodeAddr::new("::1", 7000).to_string(), "[::1]:7000");
        assert_eq!(NodeAddr::parse("nohost"), None);
        assert_eq!(NodeAddr::parse(":1"), None);
        assert_eq!(NodeAddr::parse("h:99999"), None);
    }
}
