//! The producers of the routing world: their routing cache (`stream-producer` `routing_cache.rs`), the routing
//! fetch that reports what they saw (`Coordinator::routing`), and the fenced publish rule (`crate::fence` of the
//! SDK: fence, record and the layouts' counts).

use super::*;

impl RoutingWorld {
    pub(super) fn reports_above(&self, p: &Producer) -> bool {
        let r = self.stored();
        let q = p.query();
        q.max_observed_version.max(q.routing_version) > r.routing_version || q.max_shard_count > r.shard_count
    }

    /// `Coordinator::routing`: a report above the stored routing restores first (the producer waits for the
    /// commit), then the answer.
    pub(super) fn refresh(&mut self, p: u8) -> Result<String, Violation> {
        let producer = &self.producers[p as usize];
        let query = producer.query();
        let report = Report {
            version: query.max_observed_version.max(query.routing_version),
            shard_count: query.max_shard_count,
        };
        let asks = format!(
            "P{p} fetches (v{} seen v{}/{} shards)",
            query.routing_version, query.max_observed_version, query.max_shard_count
        );
        if self.reports_above(producer) {
            if let Some((next, seals, records, why)) = self.restore(Some(report))? {
                self.producers[p as usize].waiting = true;
                let line = self.start(OpKind::Fetch(p, query), next, seals, records, why);
                return Ok(format!("{asks}: restores {line}"));
            }
        }
        let stored = self.stored().clone();
        let adopted = self.adopt(p, &stored, &query);
        Ok(format!("{asks}: {adopted}"))
    }

    /// `Coordinator::routing` for a hostile client's report (see [`Action::Forge`]): the report prompts a probe,
    /// and only what the probe finds may start a restoration.
    pub(super) fn forge(&mut self) -> Result<String, Violation> {
        let stored = self.stored();
        let report = Report {
            version: RoutingVersion(stored.routing_version.0 + 5),
            shard_count: self.redis.shards.len() as u32,
        };
        let asks = format!(
            "a hostile client fetches (reports v{} / {} shards)",
            report.version, report.shard_count
        );
        match self.restore(Some(report))? {
            Some((next, seals, records, why)) => {
                let line = self.start(OpKind::Forged, next, seals, records, why);
                Ok(format!("{asks}: restores {line}"))
            }
            None => Ok(format!("{asks}: nothing restored")),
        }
    }

    /// The producer applies the answer to `query` (`RoutingCache::apply`).
    pub(super) fn adopt(&mut self, p: u8, stored: &StreamRouting, query: &RoutingQuery) -> String {
        let a = answer(stored, query);
        let producer = &mut self.producers[p as usize];
        let fresh = (a.routing_version.0, a.shard_count, a.shard_records);
        let taken = match (a.status, producer.cache) {
            (Status::SyncMetadata, _) | (_, None) => true,
            (Status::Ok, Some(c)) => fresh.0 >= c.0,
            _ => false,
        };
        if taken {
            producer.cache = Some(fresh);
        }
        producer.max_version = producer.max_version.max(fresh.0);
        producer.max_count = producer.max_count.max(fresh.1);
        format!(
            "{} v{} {} shards{}",
            a.status,
            fresh.0,
            fresh.1,
            if taken { "" } else { " (older: ignored)" }
        )
    }

    /// Whether producer `p`'s write of key `k` would be accepted, and where it goes.
    pub(super) fn route(&self, p: u8, k: u8) -> Option<(u32, Result<(), String>)> {
        let (v, n, records) = self.producers[p as usize].cache?;
        let s = shard_for_key(self.key(k), n).0;
        let side = &self.redis.shards[s as usize];
        let record_ok =
            !records || injected(Bug::PublishWithoutRecordCheck) || side.born.is_some_and(|(born, _)| born <= v);
        // `crate::fence` of the SDK: a layout with fewer shards than the record's is from another history.
        let counted = !records || injected(Bug::PublishWithoutCountCheck);
        let verdict = if side.fence > v {
            Err(format!("fenced: fence {} above v{v}", side.fence))
        } else if !counted && side.fence_count > n {
            Err(format!("fenced: fence v{} of {} shards", side.fence, side.fence_count))
        } else if !counted && record_ok && side.born_count > n {
            Err(format!("fenced: born in a layout of {} shards", side.born_count))
        } else if !record_ok {
            Err(match side.born {
                None => "fenced: no record".to_owned(),
                Some((born, _)) => format!("fenced: born at v{born}"),
            })
        } else {
            Ok(())
        };
        Some((s, verdict))
    }

    pub(super) fn publish(&mut self, p: u8, k: u8) -> String {
        let (v, n, _) = self.producers[p as usize].cache.expect("a routing to publish with");
        let (s, verdict) = self.route(p, k).expect("a routing to publish with");
        let what = format!("P{p} publishes {} with v{v}/{n} shards to shard {s}", key_name(k));
        if let Err(why) = verdict {
            return format!("{what}: {why}");
        }
        let side = &mut self.redis.shards[s as usize];
        let last = side.last_id();
        let id = if self.now > last.ms {
            EntryId { ms: self.now, seq: 0 }
        } else {
            EntryId {
                ms: last.ms,
                seq: last.seq + 1,
            }
        };
        let meant = self.redis.routing.lineage.get(&v).copied();
        let side = &mut self.redis.shards[s as usize];
        side.entries.push(Entry {
            id,
            key: k,
            version: v,
            count: n,
            producer: p,
            seq: self.writes,
            meant,
        });
        self.writes += 1;
        self.budget.writes -= 1;
        format!("{what}: written as {}-{}", id.ms, id.seq)
    }
}
