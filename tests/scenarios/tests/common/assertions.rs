//! Checks over what the coordinator stores and what wire members read.

use super::*;
use std::collections::HashMap;
use stream_consumer::EntryId;

/// No shard is readable by two members: every shard is in at most one member's `assigned` view, and a shard is
/// in a member's `assigned` only if Redis records that member as its owner.
pub fn assert_no_split(g: &GroupDescription) {
    let owners: BTreeMap<ShardId, Option<&MemberId>> = g.shards.iter().map(|s| (s.shard, s.owner.as_ref())).collect();
    let mut readable: BTreeMap<ShardId, &MemberId> = BTreeMap::new();
    for m in &g.members {
        for s in &m.assigned {
            if let Some(other) = readable.insert(*s, &m.member_id) {
                panic!("shard {s} assigned to both {other} and {}: {g:#?}", m.member_id);
            }
            assert_eq!(
                owners.get(s).copied().flatten(),
                Some(&m.member_id),
                "shard {s} assigned to {} but owned by someone else: {g:#?}",
                m.member_id
            );
        }
    }
}

/// Members' readers, as wire members see them: no shard read by two.
pub fn assert_no_two_readers(members: &[&WireMember]) {
    let mut seen: BTreeMap<ShardId, &MemberId> = BTreeMap::new();
    for m in members {
        for s in &m.reading {
            if let Some(other) = seen.insert(*s, &m.id) {
                panic!("shard {s} read by both {other} and {}", m.id);
            }
        }
    }
}

/// Owner per shard, as stored.
pub fn owners(g: &GroupDescription) -> Vec<Option<String>> {
    g.shards
        .iter()
        .map(|s| s.owner.as_ref().map(|m| m.to_string()))
        .collect()
}

/// Targets per shard, as stored.
pub fn targets(g: &GroupDescription) -> Vec<Option<String>> {
    g.shards
        .iter()
        .map(|s| s.target.as_ref().map(|m| m.to_string()))
        .collect()
}

pub fn member<'a>(g: &'a GroupDescription, id: &str) -> Option<&'a protocol::messages::MemberDescription> {
    g.members.iter().find(|m| m.member_id.as_str() == id)
}

pub fn shard_set(v: &[ShardId]) -> BTreeSet<u32> {
    v.iter().map(|s| s.0).collect()
}

/// Reads one counter from a `/metrics` text (sum over label sets).
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Per-key order across shards (resharding moves keys): see [`cross_shard_order`].
pub struct CrossShard {
    /// (key, earlier record, later record) whose first deliveries came the other way round.
    pub violations: Vec<(String, String, String)>,
    /// Keys whose records were read from more than one shard (the test must move keys to mean anything).
    pub keys_moved: usize,
}

/// Each key is written by one sequential producer, so the order of its acknowledged publishes is its order. The
/// first delivery of each record must start no earlier than the first delivery of the key's previous record.
pub fn cross_shard_order(h: &History) -> CrossShard {
    let mut by_key: BTreeMap<String, Vec<(Instant, u32, EntryId)>> = BTreeMap::new();
    for p in h.publishes() {
        by_key
            .entry(p.key.clone().unwrap_or_default())
            .or_default()
            .push((p.acked_at, p.shard, p.entry));
    }
    let mut first: HashMap<(u32, EntryId), Instant> = HashMap::new();
    for d in h.handled() {
        let e = first.entry((d.shard, d.entry)).or_insert(d.started);
        *e = (*e).min(d.started);
    }
    let mut violations = Vec::new();
    let mut keys_moved = 0;
    for (key, mut records) in by_key {
        records.sort();
        if records.iter().any(|r| r.1 != records[0].1) {
            keys_moved += 1;
        }
        for w in records.windows(2) {
            let (a, b) = (first.get(&(w[0].1, w[0].2)), first.get(&(w[1].1, w[1].2)));
            if let (Some(a), Some(b)) = (a, b) {
                if b < a {
                    violations.push((
                        key.clone(),
                        format!("{}@{}", w[0].2, w[0].1),
                        format!("{}@{}", w[1].2, w[1].1),
                    ));
                }
            }
        }
    }
    CrossShard { violations, keys_moved }
}
