//! [`WireMember`]: a consumer played by the test over the wire.

use super::*;
use client_core::membership::{Membership, ShardState};

/// A consumer played by the test over the wire: it keeps what a well-behaved client keeps (epoch, versions,
/// what it reads) and builds the next request from the last answer.
#[derive(Debug, Clone)]
pub struct WireMember {
    pub id: MemberId,
    pub instance: String,
    /// The incarnation its requests name (the last answer's; while joining, the one it held before).
    pub incarnation: Incarnation,
    pub epoch: MemberEpoch,
    pub version: MetadataVersion,
    pub max_observed: MetadataVersion,
    /// Shards it reads.
    pub reading: BTreeSet<ShardId>,
    /// Shards it was told to drain and has not reported released yet.
    pub revoking: BTreeSet<ShardId>,
    pub last: Option<HeartbeatResponse>,
}

impl WireMember {
    pub fn new(name: &str) -> WireMember {
        WireMember {
            id: MemberId::new(name).unwrap(),
            instance: format!("{name}-i"),
            incarnation: Incarnation::NONE,
            epoch: MemberEpoch::JOIN,
            version: MetadataVersion(0),
            max_observed: MetadataVersion(0),
            reading: BTreeSet::new(),
            revoking: BTreeSet::new(),
            last: None,
        }
    }

    /// The next request: current epoch and versions, what it reads, and its revoking shards as `state`.
    pub fn request(&self, state: RevokeState) -> HeartbeatRequest {
        HeartbeatRequest {
            member_id: self.id.clone(),
            instance_id: self.instance.clone(),
            incarnation: self.incarnation,
            member_epoch: self.epoch,
            metadata_version: self.version,
            max_observed_version: self.max_observed.max(self.version),
            owned: self.reading.iter().copied().collect(),
            revoking: self
                .revoking
                .iter()
                .map(|&shard| RevokingShard { shard, state })
                .collect(),
            max_routing_version: protocol::RoutingVersion(0),
            max_shard_count: 0,
        }
    }

    /// Applies an answer with the SDK's own rules (`client_core::membership`): the member's state goes in, the
    /// rules decide, the state comes back. `reported` is how the answered request reported the revoking shards:
    /// `REVOKED` (their readers had stopped) or `DRAINING` (still finishing).
    pub fn apply(&mut self, r: &HeartbeatResponse, reported: RevokeState) {
        let reading: Vec<ShardId> = self.reading.iter().copied().collect();
        let revoking: Vec<ShardId> = self.revoking.iter().copied().collect();
        let (draining, revoked) = if reported == RevokeState::Revoked {
            (Vec::new(), revoking)
        } else {
            (revoking, Vec::new())
        };
        let mut m = Membership::resume(
            self.id.clone(),
            self.instance.clone(),
            self.max_observed,
            client_core::membership::Standing {
                incarnation: self.incarnation,
                epoch: self.epoch,
                metadata_version: self.version,
            },
            [&reading, &draining, &revoked],
        );
        // No lease here: the test decides when the member stops.
        m.apply(r, true);
        self.incarnation = m.incarnation();
        self.epoch = m.epoch();
        self.version = m.metadata_version();
        self.max_observed = m.max_observed();
        self.reading = m.shards_in(ShardState::Reading).into_iter().collect();
        self.revoking = m.revoking().into_iter().collect();
        self.last = Some(r.clone());
    }

    /// Sends the next heartbeat (revoking shards reported `state`) and applies a 200 answer.
    pub async fn beat(&mut self, api: &GroupApi, state: RevokeState) -> Result<HeartbeatResponse, Refusal> {
        let r = api.heartbeat(&self.request(state)).await;
        if let Ok(resp) = &r {
            self.apply(resp, state);
        }
        r
    }

    /// A heartbeat reporting everything drained, which must be answered 200.
    pub async fn ok(&mut self, api: &GroupApi) -> HeartbeatResponse {
        let req = self.request(RevokeState::Revoked);
        let r = api.hb(&req).await;
        self.apply(&r, RevokeState::Revoked);
        r
    }

    /// Like [`WireMember::ok`], retrying retryable 503s.
    pub async fn ok_retrying(&mut self, api: &GroupApi) -> HeartbeatResponse {
        let req = self.request(RevokeState::Revoked);
        match api.hb_retrying(&req).await {
            Ok(r) => {
                self.apply(&r, RevokeState::Revoked);
                r
            }
            Err(e) => panic!("heartbeat {req:?} refused: {e:?}"),
        }
    }

    /// Forgets everything (a new process with the same id).
    pub fn restart(&mut self, instance: &str) {
        let id = self.id.clone();
        *self = WireMember::new(id.as_str());
        self.instance = instance.to_owned();
    }
}
