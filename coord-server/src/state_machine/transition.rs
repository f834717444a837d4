//! What one transition works on and gives back: the clock, the liveness it read, the copy-on-write draft of the
//! next metadata (`Tx`), the events, and the outcome. Below every rule module, so each of them takes these from
//! here; what ends a transition (`Tx::finish`, which needs the rules' answer) is in the module root.

use protocol::messages::HeartbeatResponse;
use protocol::metadata::GroupMetadata;
use protocol::names::MemberId;
use protocol::{Incarnation, MemberEpoch, MetadataVersion, RoutingVersion, ShardId, Status};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// The coordinator's notion of time for one transition, from Redis `TIME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    /// Redis time, in ms.
    pub now_ms: u64,
    /// No member is expired before this time: the grace after a coordinator start, a Redis restart (run id change)
    /// or an observed metadata regression, when liveness facts may have been lost.
    pub expiry_allowed_from_ms: u64,
    /// Set when the caller has its own evidence that Redis lost writes: the stored metadata was last written under
    /// another Redis run id (restart or failover), or this coordinator saw a higher version before. The value is
    /// the highest version known to have existed. The transition opens a correction round, as a client report
    /// would.
    pub suspected_loss: Option<MetadataVersion>,
}

impl Clock {
    /// A clock with no grace period and no suspected loss.
    pub fn at(now_ms: u64) -> Self {
        Clock {
            now_ms,
            expiry_allowed_from_ms: 0,
            suspected_loss: None,
        }
    }
}

/// Lease ends renewed by heartbeats (the group's liveness hash), by member. A heartbeat transition needs only its
/// own member's entry; a tick needs them all.
pub type Liveness = BTreeMap<MemberId, u64>;

/// The result of one input: what to write, then what to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The next aggregate, when it changed; `None`: write nothing to the aggregate.
    pub next: Option<GroupMetadata>,
    /// Liveness renewals to write with the same compare-and-set: (member, lease end in ms).
    pub renew: Vec<(MemberId, u64)>,
    /// Liveness entries to delete (members that left the group).
    pub forget: Vec<MemberId>,
    /// The answer, valid only once the writes above succeeded.
    pub outcome: Outcome,
    /// What happened, for logs and metrics.
    pub events: Vec<Event>,
}

impl Transition {
    /// Whether anything must be written.
    pub fn writes(&self) -> bool {
        self.next.is_some() || !self.renew.is_empty() || !self.forget.is_empty()
    }
}

/// The answer of a transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Answer to a heartbeat.
    Heartbeat(HeartbeatResponse),
    /// The input was refused; nothing in `next` depends on it being accepted.
    Rejected(Rejection),
    /// Tick or admin input done.
    Done,
}

/// A refused input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The error status.
    pub status: Status,
    /// Why, for people.
    pub message: String,
    /// The epoch Redis records, for FENCED_MEMBER_EPOCH.
    pub member_epoch: Option<MemberEpoch>,
}

/// Something a transition did, for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The coordinator suspects lost writes (Redis run id change, or it saw a higher version itself).
    LossSuspected {
        /// The highest version known to have existed.
        known: MetadataVersion,
        /// The stored version.
        stored: MetadataVersion,
    },
    /// A client reported a higher version than stored.
    RegressionReported {
        /// The client's version.
        reported: MetadataVersion,
        /// The stored version.
        stored: MetadataVersion,
    },
    /// A client reported a version above the stored one after a closed round retired this history's versions,
    /// and the coordinator has seen no new loss since: no coordinator issued it. It was ignored.
    UnissuedVersionIgnored {
        /// The client's version.
        reported: MetadataVersion,
        /// The stored version.
        stored: MetadataVersion,
    },
    /// A request named an incarnation no coordinator of the group can have minted; it was taken as naming none.
    ImplausibleIncarnationIgnored {
        /// The incarnation named.
        named: protocol::Incarnation,
        /// The highest one that would have counted.
        ceiling: protocol::Incarnation,
    },
    /// A client reported a version no lost history can have produced; it was ignored.
    ImplausibleVersionIgnored {
        /// The client's version.
        reported: MetadataVersion,
        /// The highest version that would have counted.
        ceiling: MetadataVersion,
    },
    /// A correction round opened.
    CorrectionOpened {
        /// Highest reported version.
        reported: MetadataVersion,
        /// Stored version.
        stored: MetadataVersion,
    },
    /// The correction round closed.
    CorrectionClosed,
    /// A member reads or drains a shard Redis records for someone else.
    ForeignClaim {
        /// The shard.
        shard: ShardId,
        /// The member.
        member: MemberId,
    },
    /// A member joined (or a new incarnation replaced an old one).
    MemberJoined(MemberId),
    /// A member left.
    MemberLeft(MemberId),
    /// A member's lease ran out and it was removed.
    MemberExpired(MemberId),
    /// A member was fenced.
    MemberFenced {
        /// The member.
        member: MemberId,
        /// Why.
        reason: &'static str,
    },
    /// A shard's owner released it.
    ShardReleased {
        /// The shard.
        shard: ShardId,
        /// Its previous owner.
        from: MemberId,
    },
    /// A shard became owned by its target.
    ShardGranted {
        /// The shard.
        shard: ShardId,
        /// Its new owner.
        to: MemberId,
    },
    /// A REVOKED ack did not match the recorded ownership and was ignored.
    StaleAckIgnored {
        /// The shard.
        shard: ShardId,
        /// The member.
        member: MemberId,
    },
    /// The group adopted a newer stream routing.
    RoutingAdopted {
        /// The new routing version.
        version: RoutingVersion,
        /// The new shard count.
        shard_count: u32,
    },
    /// A newer routing could not be adopted (fewer shards than the group has, or too many open reshards).
    RoutingRefused {
        /// The refused routing version.
        version: RoutingVersion,
    },
    /// The group adopted a growth: its children are held until every parent is drained.
    ReshardOpened {
        /// The growth's routing version.
        version: RoutingVersion,
        /// Shards `0..parents` are the parents.
        parents: u32,
        /// Shards `parents..shard_count` are the children.
        shard_count: u32,
    },
    /// The coordinator sealed a parent for the group (no seal was recorded), or sealed it again (its fence was
    /// lost).
    ParentSealed {
        /// The growth.
        version: RoutingVersion,
        /// The parent.
        shard: ShardId,
        /// A second seal after a lost fence: the parent is drained again up to it.
        again: bool,
    },
    /// The group drained a parent up to its seal.
    ParentDrained {
        /// The growth.
        version: RoutingVersion,
        /// The parent.
        shard: ShardId,
    },
    /// Every parent of a growth is drained: its children became readable for the group.
    ChildrenReleased {
        /// The growth.
        version: RoutingVersion,
        /// How many children.
        children: u32,
        /// How long they were held (Redis time, from the adoption).
        waited_ms: u64,
    },
}

/// A copy-on-write draft of the next metadata: reads see the latest state, and the first write clones.
#[derive(Debug)]
pub struct Tx<'a> {
    pub(super) meta: Cow<'a, GroupMetadata>,
    pub(super) liveness: &'a Liveness,
    /// Events so far.
    pub events: Vec<Event>,
    /// Liveness entries to delete.
    pub forget: Vec<MemberId>,
}

impl<'a> Tx<'a> {
    pub(super) fn new(meta: &'a GroupMetadata, liveness: &'a Liveness) -> Self {
        Tx {
            meta: Cow::Borrowed(meta),
            liveness,
            events: Vec::new(),
            forget: Vec::new(),
        }
    }

    /// The draft as it stands.
    pub fn get(&self) -> &GroupMetadata {
        &self.meta
    }

    /// The draft, for writing (clones on first use).
    pub fn get_mut(&mut self) -> &mut GroupMetadata {
        self.meta.to_mut()
    }

    /// The liveness entries the caller loaded.
    pub fn liveness(&self) -> &Liveness {
        self.liveness
    }
}

/// What to answer, derived from the recorded metadata by [`Tx::finish`].
pub(super) enum Answer {
    Member { id: MemberId, status: Status },
    Left { id: MemberId, incarnation: Incarnation },
    Rejected(Rejection),
    Done,
}

impl Answer {
    pub(super) fn reject(status: Status, message: impl Into<String>, member_epoch: Option<MemberEpoch>) -> Self {
        Answer::Rejected(Rejection {
            status,
            message: message.into(),
            member_epoch,
        })
    }
}
