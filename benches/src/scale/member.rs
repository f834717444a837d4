//! A simulated member: the heartbeat request a consumer would send, kept up to date from the answers the way the
//! SDK applies them (reads what it is assigned, reports every revoke as done at once), without reading anything.
//!
//! Heartbeats go to an in-process [`Coordinator`] (no HTTP): the coordinator's own cost, not that of an HTTP
//! client and server sharing the same two cores.

use std::time::{Duration, Instant};

use coord_server::{Coordinator, Error};
use protocol::messages::{HeartbeatRequest, HeartbeatResponse, RevokeState, RevokingShard};
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{Incarnation, MemberEpoch, MetadataVersion, RoutingVersion, Status};

/// One member's request state.
#[derive(Debug, Clone)]
pub struct SimMember {
    /// The next request to send.
    pub req: HeartbeatRequest,
    /// When the last answered call was sent.
    pub last_answer: Option<Instant>,
}

/// What one call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// Answered `OK`, `SYNC_METADATA` or `REVOKE_PENDING`.
    Answered,
    /// Refused (fenced, unknown member): the member joins again at its next call.
    Rejected,
    /// Failed (store unavailable, busy mutex): the same request goes again next time.
    Failed,
}

impl SimMember {
    /// A member about to join, named `id`.
    pub fn joining(id: &str) -> Self {
        SimMember {
            req: HeartbeatRequest {
                member_id: MemberId::new(id).expect("bench member ids are valid"),
                instance_id: format!("i-{id}"),
                incarnation: Incarnation::NONE,
                member_epoch: MemberEpoch::JOIN,
                metadata_version: MetadataVersion::default(),
                max_observed_version: MetadataVersion::default(),
                owned: Vec::new(),
                revoking: Vec::new(),
                max_routing_version: RoutingVersion(0),
                max_shard_count: 0,
            },
            last_answer: None,
        }
    }

    /// Whether the member is in the group (joined and not left).
    pub fn is_member(&self) -> bool {
        self.req.member_epoch.0 > 0
    }

    /// Shards it reads now.
    pub fn owned(&self) -> usize {
        self.req.owned.len()
    }

    /// Applies an answer as the SDK would: reads what is assigned, acknowledges every revoke at once.
    pub fn apply(&mut self, r: &HeartbeatResponse) {
        self.req.incarnation = r.incarnation;
        self.req.member_epoch = r.member_epoch;
        self.req.metadata_version = r.metadata_version;
        self.req.max_observed_version = self.req.max_observed_version.max(r.metadata_version);
        self.req.revoking = r
            .revoke
            .iter()
            .map(|&shard| RevokingShard {
                shard,
                state: RevokeState::Revoked,
            })
            .collect();
        if r.status == Status::Ok {
            self.req.owned = r.assigned.clone();
        } else {
            self.req.owned.retain(|s| !r.revoke.contains(s));
        }
    }

    /// The leave request (epoch -1): everything it read reported revoked, as the SDK's close does.
    pub fn leave_request(&self) -> HeartbeatRequest {
        let mut req = self.req.clone();
        req.member_epoch = MemberEpoch::LEAVE;
        req.revoking = req
            .owned
            .drain(..)
            .map(|shard| RevokingShard {
                shard,
                state: RevokeState::Revoked,
            })
            .collect();
        req
    }

    /// After a leave or a refusal: the next call joins again (naming the last incarnation, as the SDK does).
    pub fn rejoin(&mut self) {
        self.req.member_epoch = MemberEpoch::JOIN;
        self.req.owned.clear();
        self.req.revoking.clear();
    }
}

/// A group the members of a bench beat into.
#[derive(Clone)]
pub struct Target {
    /// The coordinator (in-process).
    pub coordinator: Coordinator,
    /// The stream.
    pub stream: StreamName,
    /// The group.
    pub group: GroupName,
}

impl Target {
    /// Sends `m`'s request, applies the answer; returns what happened and how long the call took.
    pub async fn beat(&self, m: &mut SimMember) -> (Beat, Duration) {
        let t = Instant::now();
        let result = self.coordinator.heartbeat(&self.stream, &self.group, &m.req).await;
        let took = t.elapsed();
        let beat = match result {
            Ok(r) => {
                m.apply(&r);
                m.last_answer = Some(t);
                Beat::Answered
            }
            Err(Error::Rejected { .. }) => {
                m.rejoin();
                Beat::Rejected
            }
            Err(_) => Beat::Failed,
        };
        (beat, took)
    }

    /// Sends `m`'s leave; true when the coordinator accepted it. The member joins again at its next call either way.
    pub async fn leave(&self, m: &mut SimMember) -> bool {
        let req = m.leave_request();
        let ok = self
            .coordinator
            .heartbeat(&self.stream, &self.group, &req)
            .await
            .is_ok();
        m.rejoin();
        ok
    }
}
