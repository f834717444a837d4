//! Human output: aligned tables and short durations. (`--json` output is the wire types, printed by `main`.)

use protocol::messages::{GroupDescription, GroupList, QuotaDescription, QuotaUsage, RoutingDescription};
use protocol::ShardId;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// Lag and pending entries of one shard, read from the coordinator's `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ShardLag {
    /// The shard.
    pub shard: ShardId,
    /// Entries not yet delivered to the group (absent when Redis cannot tell).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
    /// Entries delivered but not acknowledged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<u64>,
}

/// An aligned table: a header row and data rows, columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                l.push_str(cell);
                l.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// `1.5s`, `2m03s`, `1h02m`.
pub fn duration_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{}.{}s", s, (ms % 1000) / 100),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// Milliseconds since the epoch by this machine's clock. Lease ends are Redis times: remaining times computed with
/// it are approximate (clock skew), which the output says.
fn local_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn shard_list(shards: &[ShardId]) -> String {
    if shards.is_empty() {
        return "-".to_owned();
    }
    shards.iter().map(|s| s.0.to_string()).collect::<Vec<_>>().join(",")
}

/// `coordctl groups`.
pub fn groups(list: &GroupList) -> String {
    if list.groups.is_empty() {
        return "no groups (if groups exist but the index was lost: coordctl groups --rebuild)\n".to_owned();
    }
    let rows: Vec<Vec<String>> = list
        .groups
        .iter()
        .map(|g| vec![g.stream.to_string(), g.group.to_string()])
        .collect();
    table(&["STREAM", "GROUP"], &rows)
}

/// `coordctl quota`: one row per quota, `unlimited` where the coordinator enforces none.
pub fn quota(q: &QuotaDescription) -> String {
    let limit = |n: u32| {
        if n == u32::MAX {
            "unlimited".to_owned()
        } else {
            n.to_string()
        }
    };
    let usage = |name: &str, u: QuotaUsage| vec![name.to_owned(), u.used.to_string(), limit(u.limit)];
    let rows = vec![
        usage("groups", q.groups),
        usage("shards per group (largest)", q.shards_per_group),
        usage("members per group (largest)", q.members_per_group),
        vec![
            "requests per second (this replica)".to_owned(),
            format!("{} available", q.requests_available),
            format!("{} (burst {})", limit(q.requests_per_second), limit(q.request_burst)),
        ],
    ];
    format!("token {}\n{}", q.token, table(&["QUOTA", "USED", "LIMIT"], &rows))
}

/// `coordctl describe`.
pub fn group(g: &GroupDescription, lag: Option<&[ShardLag]>) -> String {
    let now = local_now_ms();
    let mut out = header(g, now);
    out.push_str("\nmembers (lease left by this machine's clock, approximate)\n");
    out.push_str(&members(g, now));
    out.push_str("\nshards (target = where the assignor wants it, owner = who may read or must drain it)\n");
    out.push_str(&shards(g, lag.unwrap_or_default()));
    if lag.is_none() {
        out.push_str("(lag: the coordinator's /metrics was not readable)\n");
    }
    out
}

/// The group's counters, timings and correction round.
fn header(g: &GroupDescription, now: u64) -> String {
    let mut out = String::new();
    let t = &g.timings;
    let _ = writeln!(
        out,
        "group {} of stream {}\nrevision {}  metadataVersion {}  assignmentEpoch {}  routingVersion {}  shards {}",
        g.group, g.stream, g.revision.0, g.metadata_version, g.assignment_epoch, g.routing_version, g.shard_count
    );
    let _ = writeln!(
        out,
        "timings: memberTtl {}  heartbeatInterval {}  rebalanceTimeout {}  assignmentLease {}",
        duration_ms(t.member_ttl_ms),
        duration_ms(t.heartbeat_interval_ms),
        duration_ms(t.rebalance_timeout_ms),
        duration_ms(t.assignment_lease_ms)
    );
    match &g.correction {
        None => out.push_str("correction round: none\n"),
        Some(c) => {
            let names = |v: &[protocol::names::MemberId]| {
                if v.is_empty() {
                    "-".to_owned()
                } else {
                    v.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
                }
            };
            let _ = writeln!(
                out,
                "correction round: OPEN for {} (reported max version {}), synced: {}, unsynced: {}",
                duration_ms(now.saturating_sub(c.started_at_ms)),
                c.reported_max_version,
                names(&c.synced),
                names(&c.unsynced)
            );
        }
    }
    out
}

/// The members table (`none` for a group without members).
fn members(g: &GroupDescription, now: u64) -> String {
    if g.members.is_empty() {
        return "  none\n".to_owned();
    }
    let rows: Vec<Vec<String>> = g
        .members
        .iter()
        .map(|m| {
            let left = if m.lease_until_ms > now {
                duration_ms(m.lease_until_ms - now)
            } else {
                "expired".to_owned()
            };
            vec![
                m.member_id.to_string(),
                m.epoch.to_string(),
                m.instance_id.clone(),
                left,
                if m.fenced { "yes".into() } else { "no".into() },
                shard_list(&m.assigned),
                shard_list(&m.pending),
                shard_list(&m.revoke),
            ]
        })
        .collect();
    table(
        &[
            "MEMBER",
            "EPOCH",
            "INSTANCE",
            "LEASE LEFT",
            "FENCED",
            "ASSIGNED",
            "PENDING",
            "REVOKE",
        ],
        &rows,
    )
}

/// The shards table, with each shard's lag where the coordinator's metrics gave it.
fn shards(g: &GroupDescription, lag: &[ShardLag]) -> String {
    let lag_by: BTreeMap<u32, ShardLag> = lag.iter().map(|l| (l.shard.0, *l)).collect();
    let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    let rows: Vec<Vec<String>> = g
        .shards
        .iter()
        .map(|s| {
            let state = match (&s.target, &s.owner) {
                (_, None) => "free",
                (Some(t), Some(o)) if t == o => "owned",
                _ => "moving (owner drains)",
            };
            let l = lag_by.get(&s.shard.0);
            vec![
                s.shard.0.to_string(),
                s.target.as_ref().map_or("-".to_owned(), ToString::to_string),
                s.owner.as_ref().map_or("-".to_owned(), ToString::to_string),
                state.to_owned(),
                s.fencing_token.to_string(),
                opt(l.and_then(|l| l.lag)),
                opt(l.and_then(|l| l.pending)),
            ]
        })
        .collect();
    table(&["SHARD", "TARGET", "OWNER", "STATE", "TOKEN", "LAG", "PENDING"], &rows)
}

/// `coordctl routing` and `coordctl add-shards`.
pub fn routing(r: &RoutingDescription) -> String {
    format!(
        "stream {}\nrevision {}  routingVersion {}  shards {}  routingLease {}\n",
        r.stream,
        r.revision.0,
        r.routing_version,
        r.shard_count,
        duration_ms(r.routing_lease_ms)
    )
}

/// The per-shard lag of one group from a `/metrics` page (`redis_stream_coord_shard_lag` and `_pending`).
pub fn lag_from_metrics(text: &str, stream: &str, group: &str) -> Vec<ShardLag> {
    let mut by_shard: BTreeMap<u32, ShardLag> = BTreeMap::new();
    for line in text.lines() {
        let (kind, rest) = if let Some(rest) = line.strip_prefix("redis_stream_coord_shard_lag{") {
            ("lag", rest)
        } else if let Some(rest) = line.strip_prefix("redis_stream_coord_shard_pending{") {
            ("pending", rest)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let mut s = None;
        let mut g = None;
        let mut shard = None;
        for pair in labels.split("\",") {
            if let Some((k, v)) = pair.split_once("=\"") {
                let v = v.trim_end_matches('"');
                match k {
                    "stream" => s = Some(v),
                    "group" => g = Some(v),
                    "shard" => shard = v.parse::<u32>().ok(),
                    _ => {}
                }
            }
        }
        let (Some(true), Some(true), Some(shard)) = (s.map(|v| v == stream), g.map(|v| v == group), shard) else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let entry = by_shard.entry(shard).or_insert(ShardLag {
            shard: ShardId(shard),
            ..ShardLag::default()
        });
        match kind {
            "lag" => entry.lag = Some(value as u64),
            _ => entry.pending = Some(value as u64),
        }
    }
    by_shard.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let t = table(
            &["A", "BB"],
            &[vec!["long".into(), "x".into()], vec!["s".into(), "yy".into()]],
        );
        assert_eq!(t, "A     BB\nlong  x\ns     yy\n");
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(duration_ms(1500), "1.5s");
        assert_eq!(duration_ms(123_000), "2m03s");
        assert_eq!(duration_ms(3_720_000), "1h02m");
    }

    #[test]
    fn lag_is_read_for_one_group() {
        let text = "\
# TYPE redis_stream_coord_shard_lag gauge
redis_stream_coord_shard_lag{stream=\"orders\",group=\"billing\",shard=\"1\"} 3
redis_stream_coord_shard_lag{stream=\"orders\",group=\"other\",shard=\"1\"} 9
redis_stream_coord_shard_pending{stream=\"orders\",group=\"billing\",shard=\"1\"} 1
redis_stream_coord_shard_pending{stream=\"orders\",group=\"billing\",shard=\"0\"} 0
";
        let lag = lag_from_metrics(text, "orders", "billing");
        assert_eq!(
            lag,
            vec![
                ShardLag {
                    shard: ShardId(0),
                    lag: None,
                    pending: Some(0)
                },
                ShardLag {
                    shard: ShardId(1),
                    lag: Some(3),
                    pending: Some(1)
                },
            ]
        );
    }
}
