//! Test harness for the pure core, in the role of Kafka's `GroupMetadataManagerTestContext`: it keeps the
//! recorded metadata and liveness, a fake Redis clock, and applies transitions as the store would.

use client_core::membership::Membership;
use protocol::messages::{HeartbeatRequest, HeartbeatResponse, RevokeState, RevokingShard};
use protocol::metadata::{GroupMetadata, GroupTimings, StreamRouting};
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{FencingToken, Incarnation, MemberEpoch, MetadataVersion, ShardId};

use super::transition::{Clock, Liveness, Outcome, Rejection, Transition};
use super::{apply, create_group, Input};

pub const TTL: u64 = 10_000;
pub const INTERVAL: u64 = 1_000;
pub const REBALANCE: u64 = 5_000;
pub const LEASE: u64 = 8_000;

/// In a request built by [`req`]: "the incarnation the group records for this member now", filled in by
/// [`Harness::apply`] when the request is applied (`NONE` when the member is absent). Scripts about one process
/// per member use it; tests about incarnations name them explicitly.
pub const RECORDED: Incarnation = Incarnation(u64::MAX);

pub fn member(name: &str) -> MemberId {
    MemberId::new(name).unwrap()
}

pub fn shards(ids: &[u32]) -> Vec<ShardId> {
    ids.iter().map(|&i| ShardId(i)).collect()
}

#[derive(Debug, Clone)]
pub struct Harness {
    pub meta: GroupMetadata,
    pub liveness: Liveness,
    pub now: u64,
    pub grace_until: u64,
    /// What the coordinator suspects after a Redis rollback it noticed (cleared once a write recorded it).
    pub suspected: Option<MetadataVersion>,
    pub writes: usize,
}

impl Harness {
    pub fn new(shard_count: u32) -> Self {
        let stream = StreamName::new("s").unwrap();
        let routing = StreamRouting::new(stream.clone(), shard_count, 1_000);
        let timings = GroupTimings {
            member_ttl_ms: TTL,
            heartbeat_interval_ms: INTERVAL,
            rebalance_timeout_ms: REBALANCE,
            assignment_lease_ms: LEASE,
        };
        let meta = create_group(stream, GroupName::new("g").unwrap(), &routing, timings, 1_000);
        Harness {
            meta,
            liveness: Liveness::new(),
            now: 1_000,
            grace_until: 0,
            suspected: None,
            writes: 0,
        }
    }

    pub fn clock(&self) -> Clock {
        Clock {
            now_ms: self.now,
            expiry_allowed_from_ms: self.grace_until,
            suspected_loss: self.suspected,
        }
    }

    /// Applies an input and records its writes, as the store's compare-and-set would.
    pub fn apply(&mut self, input: Input<'_>) -> Transition {
        let resolved;
        let input = match input {
            Input::Heartbeat(r) if r.incarnation == RECORDED => {
                let mut r = r.clone();
                r.incarnation = self
                    .meta
                    .members
                    .get(&r.member_id)
                    .map_or(Incarnation::NONE, |m| m.incarnation);
                resolved = r;
                Input::Heartbeat(&resolved)
            }
            other => other,
        };
        let t = apply(&self.meta, &self.liveness, input, self.clock());
        self.record(&t);
        t
    }

    pub fn record(&mut self, t: &Transition) {
        if let Some(next) = &t.next {
            assert!(
                next.metadata_version >= self.meta.metadata_version,
                "metadata version went down"
            );
            assert!(
                next.assignment_epoch >= self.meta.assignment_epoch,
                "assignment epoch went down"
            );
            for (i, (old, new)) in self.meta.shards.iter().zip(&next.shards).enumerate() {
                assert!(
                    new.fencing_token >= old.fencing_token,
                    "fencing token of shard {i} went down"
                );
            }
            self.meta = next.clone();
            self.writes += 1;
            // The write records the current Redis run id: the suspicion is recorded (as an open round).
            self.suspected = None;
        }
        for (m, lease) in &t.renew {
            let e = self.liveness.entry(m.clone()).or_insert(0);
            *e = (*e).max(*lease);
        }
        for m in &t.forget {
            self.liveness.remove(m);
        }
    }

    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
    }

    pub fn tick(&mut self) -> Transition {
        self.apply(Input::Tick { routing: None })
    }

    pub fn send(&mut self, req: &HeartbeatRequest) -> Result<HeartbeatResponse, Rejection> {
        match self.apply(Input::Heartbeat(req)).outcome {
            Outcome::Heartbeat(r) => Ok(r),
            Outcome::Rejected(r) => Err(r),
            Outcome::Done => panic!("heartbeat without answer"),
        }
    }

    /// A join from a fresh instance named after the member.
    pub fn join(&mut self, name: &str) -> HeartbeatResponse {
        self.send(&req(name, 0, MetadataVersion(0), &[], &[]))
            .expect("join accepted")
    }

    pub fn owner(&self, shard: u32) -> Option<&str> {
        self.meta.shards[shard as usize].owner.as_ref().map(|m| m.as_str())
    }

    pub fn token(&self, shard: u32) -> FencingToken {
        self.meta.shards[shard as usize].fencing_token
    }

    pub fn target(&self, shard: u32) -> Option<&str> {
        self.meta.shards[shard as usize].target.as_ref().map(|m| m.as_str())
    }
}

/// A heartbeat request from instance `"<name>-i"`.
pub fn req(name: &str, epoch: i64, version: MetadataVersion, owned: &[u32], revoked: &[u32]) -> HeartbeatRequest {
    HeartbeatRequest {
        member_id: member(name),
        instance_id: format!("{name}-i"),
        // A join of this script's process names none (its first join, or a retry of it); anything else speaks for
        // the recorded incarnation.
        incarnation: if epoch == 0 { Incarnation::NONE } else { RECORDED },
        member_epoch: MemberEpoch(epoch),
        metadata_version: version,
        max_observed_version: version,
        owned: shards(owned),
        revoking: revoked
            .iter()
            .map(|&s| RevokingShard {
                shard: ShardId(s),
                state: RevokeState::Revoked,
            })
            .collect(),
        max_routing_version: protocol::RoutingVersion(0),
        max_shard_count: 0,
    }
}

/// The heartbeat a well-behaved client sends after applying `last`: it reads what is assigned and reports
/// `revoked` as stopped. Built by the SDK's own rules ([`client_core::membership`]) from that state, so the
/// request has the shape a real client's has; the script only decides what the client reads and acknowledges.
pub fn follow_up(last: &HeartbeatResponse, revoked: &[u32]) -> HeartbeatRequest {
    Membership::resume(
        last.member_id.clone(),
        format!("{}-i", last.member_id),
        last.metadata_version,
        client_core::membership::Standing {
            incarnation: last.incarnation,
            epoch: last.member_epoch,
            metadata_version: last.metadata_version,
        },
        [&last.assigned, &[], &shards(revoked)],
    )
    .request()
}
