//! Tenants: a tenant is a stream-name prefix of the token table (`role:tenant-a.:token`, see [`crate::auth`]),
//! the same prefix as its Redis ACL users (`deploy/redis/README.md`, "Tenants"). A stream belongs to the longest
//! configured prefix it starts with; a stream that matches none (or every stream, without a token table)
//! belongs to [`DEFAULT_TENANT`]. `*` grants name no tenant.
//!
//! What a tenant uses (entries, memory) is summed from the usage scrape ([`crate::store::usage`]) here, a pure
//! function, so `/metrics` and `/status` show the same numbers.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::auth::{Grant, StreamScope};
use crate::store::usage::{MemoryInfo, StreamUsage};

/// The tenant of streams that match no configured prefix.
pub const DEFAULT_TENANT: &str = "default";

/// The tenant prefixes of a token table, sorted, each once.
pub fn prefixes(grants: &[Grant]) -> Vec<String> {
    let mut out: Vec<String> = grants
        .iter()
        .filter_map(|g| match &g.scope {
            StreamScope::Prefix(p) => Some(p.clone()),
            StreamScope::All => None,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The tenant of `stream`: the longest of `prefixes` it starts with, else [`DEFAULT_TENANT`].
pub fn tenant_of<'a>(prefixes: &'a [String], stream: &str) -> &'a str {
    prefixes
        .iter()
        .filter(|p| stream.starts_with(p.as_str()))
        .max_by_key(|p| p.len())
        .map_or(DEFAULT_TENANT, String::as_str)
}

/// What one tenant's streams use on the data Redis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantUsage {
    /// The tenant (its prefix, or [`DEFAULT_TENANT`]).
    pub tenant: String,
    /// Streams scraped.
    pub streams: u32,
    /// Shards scraped.
    pub shards: u32,
    /// Entries over those shards.
    pub length: u64,
    /// Bytes over those shards (`MEMORY USAGE`, sampled).
    pub memory_bytes: u64,
}

/// What one Redis reports of its memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RedisMemory {
    /// `data` (shard streams and fences) or `metadata` (the coordinator's keys, when on a Redis of its own).
    pub redis: &'static str,
    /// `used_memory`.
    pub used_bytes: u64,
    /// `maxmemory` (0: no limit).
    pub max_bytes: u64,
}

impl RedisMemory {
    /// `role` and what `INFO memory` said.
    pub fn new(redis: &'static str, info: MemoryInfo) -> Self {
        RedisMemory {
            redis,
            used_bytes: info.used_bytes,
            max_bytes: info.max_bytes,
        }
    }
}

/// One usage scrape, per tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    /// Per tenant, in name order; a configured tenant without streams is listed with zeros.
    pub tenants: Vec<TenantUsage>,
    /// Each Redis's memory (`data`, then `metadata` when it is a Redis of its own).
    pub redis: Vec<RedisMemory>,
    /// Whether the scrape's shard bound left streams or shards out (the sums are then too low).
    pub truncated: bool,
}

/// Sums `streams` per tenant of `prefixes`.
pub fn by_tenant(prefixes: &[String], streams: &[StreamUsage]) -> Vec<TenantUsage> {
    let mut out: BTreeMap<&str, TenantUsage> = prefixes.iter().map(|p| (p.as_str(), empty(p))).collect();
    for s in streams {
        let tenant = tenant_of(prefixes, &s.stream);
        let t = out.entry(tenant).or_insert_with(|| empty(tenant));
        t.streams += 1;
        t.shards += s.shards;
        t.length += s.length;
        t.memory_bytes += s.memory_bytes;
    }
    out.into_values().collect()
}

fn empty(tenant: &str) -> TenantUsage {
    TenantUsage {
        tenant: tenant.to_owned(),
        streams: 0,
        shards: 0,
        length: 0,
        memory_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Role;

    fn usage(stream: &str, length: u64, memory_bytes: u64) -> StreamUsage {
        StreamUsage {
            stream: stream.into(),
            shards: 2,
            length,
            memory_bytes,
        }
    }

    #[test]
    fn the_longest_prefix_names_the_tenant_and_star_names_none() {
        let grants = vec![
            Grant::new(Role::Consumer, StreamScope::parse("tenant-a.").unwrap(), "t1").unwrap(),
            Grant::new(Role::Producer, StreamScope::parse("tenant-a.").unwrap(), "t2").unwrap(),
            Grant::new(Role::Admin, StreamScope::parse("tenant-a.eu.").unwrap(), "t3").unwrap(),
            Grant::new(Role::Admin, StreamScope::All, "t4").unwrap(),
        ];
        let p = prefixes(&grants);
        assert_eq!(p, ["tenant-a.", "tenant-a.eu."]);
        assert_eq!(tenant_of(&p, "tenant-a.orders"), "tenant-a.");
        assert_eq!(tenant_of(&p, "tenant-a.eu.orders"), "tenant-a.eu.");
        assert_eq!(tenant_of(&p, "tenant-b.orders"), DEFAULT_TENANT);
        assert_eq!(tenant_of(&[], "anything"), DEFAULT_TENANT);
    }

    #[test]
    fn usage_is_summed_per_tenant_and_idle_tenants_show_zero() {
        let p = vec!["a.".to_owned(), "b.".to_owned(), "c.".to_owned()];
        let t = by_tenant(
            &p,
            &[
                usage("a.x", 10, 100),
                usage("a.y", 5, 50),
                usage("b.x", 1, 7),
                usage("z", 3, 9),
            ],
        );
        let row = |name: &str| t.iter().find(|u| u.tenant == name).cloned().unwrap();
        assert_eq!(
            (
                row("a.").streams,
                row("a.").shards,
                row("a.").length,
                row("a.").memory_bytes
            ),
            (2, 4, 15, 150)
        );
        assert_eq!((row("b.").length, row("b.").memory_bytes), (1, 7));
        assert_eq!((row("c.").streams, row("c.").length), (0, 0));
        assert_eq!((row(DEFAULT_TENANT).length, row(DEFAULT_TENANT).memory_bytes), (3, 9));
        assert_eq!(t.len(), 4);
    }
}
