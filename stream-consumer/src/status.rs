//! What a consumer reports about itself: [`ConsumerStatus`] (published after every change), its
//! [`HeartbeatCounters`], and the [`CloseReport`] of a stopped consumer.

use protocol::names::MemberId;
use protocol::{AssignmentEpoch, MemberEpoch, MetadataVersion, ShardId, Status};
use std::time::Instant;

/// Counters of heartbeat outcomes since the consumer started (a monitoring signal: heartbeat success and
/// failure by status).
///
/// ```
/// # fn example(handle: &stream_consumer::ConsumerHandle) {
/// let counters = handle.status().heartbeats;
/// let sent = counters.answers() + counters.fenced + counters.unknown_member + counters.failed;
/// if sent > 0 && counters.failed * 10 > sent {
///     eprintln!("more than 10 % of heartbeats failed: {counters:?}");
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeartbeatCounters {
    /// `OK` answers.
    pub ok: u64,
    /// `SYNC_METADATA` answers.
    pub sync_metadata: u64,
    /// `REVOKE_PENDING` answers.
    pub revoke_pending: u64,
    /// `FENCED_MEMBER_EPOCH` refusals.
    pub fenced: u64,
    /// `UNKNOWN_MEMBER` refusals.
    pub unknown_member: u64,
    /// Other failures (unreachable, terminating, store or metadata unavailable, ...).
    pub failed: u64,
    /// Times the assignment lease ran out and every reader was stopped.
    pub lease_expiries: u64,
    /// Times the member lost its assignment and rejoined with epoch 0.
    pub rejoins: u64,
    /// Times the member gave its shards back because a reader could not read from Redis for longer than
    /// [`Timings::read_failure_timeout`](crate::Timings::read_failure_timeout).
    pub redis_give_backs: u64,
}

impl HeartbeatCounters {
    pub(crate) fn count(&mut self, status: Status) {
        match status {
            Status::Ok => self.ok += 1,
            Status::SyncMetadata => self.sync_metadata += 1,
            Status::RevokePending => self.revoke_pending += 1,
            Status::FencedMemberEpoch => self.fenced += 1,
            Status::UnknownMember => self.unknown_member += 1,
            _ => self.failed += 1,
        }
    }

    /// Heartbeats answered with `OK`, `SYNC_METADATA` or `REVOKE_PENDING`.
    pub fn answers(&self) -> u64 {
        self.ok + self.sync_metadata + self.revoke_pending
    }
}

/// A snapshot of a consumer's state, published after every change (see [`Consumer::status`](crate::Consumer::status)).
///
/// ```
/// # fn example(handle: &stream_consumer::ConsumerHandle) {
/// let status = handle.status();
/// if status.joined {
///     println!("{} reads {:?} at epoch {:?}", status.member_id, status.reading, status.member_epoch);
/// }
/// if let Some(end) = status.lease_expires_at {
///     println!("lease ends in {:?}", end.saturating_duration_since(std::time::Instant::now()));
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerStatus {
    /// The member id.
    pub member_id: MemberId,
    /// Whether the current incarnation has an answer from the coordinator.
    pub joined: bool,
    /// The epoch the next heartbeat carries (0: joining).
    pub member_epoch: MemberEpoch,
    /// Version of the last applied answer.
    pub metadata_version: MetadataVersion,
    /// Highest metadata version ever observed (also through the version store).
    pub max_observed_version: MetadataVersion,
    /// Assignment epoch of the last applied answer.
    pub assignment_epoch: AssignmentEpoch,
    /// Shards being read.
    pub reading: Vec<ShardId>,
    /// Shards in local revoking state (draining or revoked, not yet released).
    pub revoking: Vec<ShardId>,
    /// Shards assigned to this member but still held by their previous owner (not read).
    pub pending: Vec<ShardId>,
    /// Shards with work in flight, and how much.
    pub in_flight: Vec<(ShardId, usize)>,
    /// Status of the last heartbeat (answer or error), if any.
    pub last_status: Option<Status>,
    /// When the assignment lease runs out, if one is held.
    pub lease_expires_at: Option<Instant>,
    /// Heartbeat outcome counters.
    pub heartbeats: HeartbeatCounters,
    /// Whether the consumer has stopped.
    pub closed: bool,
}

impl ConsumerStatus {
    pub(crate) fn initial(member_id: MemberId) -> Self {
        ConsumerStatus {
            member_id,
            joined: false,
            member_epoch: MemberEpoch::JOIN,
            metadata_version: MetadataVersion::default(),
            max_observed_version: MetadataVersion::default(),
            assignment_epoch: AssignmentEpoch::default(),
            reading: Vec::new(),
            revoking: Vec::new(),
            pending: Vec::new(),
            in_flight: Vec::new(),
            last_status: None,
            lease_expires_at: None,
            heartbeats: HeartbeatCounters::default(),
            closed: false,
        }
    }
}

/// How a consumer stopped.
///
/// ```
/// # async fn example(handle: stream_consumer::ConsumerHandle) -> Result<(), stream_consumer::ConsumerError> {
/// let report = handle.close().await?;
/// if !report.left {
///     eprintln!("leave not acknowledged: the shards move when the member TTL runs out");
/// }
/// for shard in &report.killed_shards {
///     eprintln!("shard {shard}: in-flight work dropped; its entries are delivered again");
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloseReport {
    /// Whether the leave (epoch -1) was acknowledged. If not, the coordinator moves the shards when the member
    /// TTL runs out instead of at once.
    pub left: bool,
    /// Shards whose in-flight work was dropped instead of finished (the drain deadline passed, or the consumer
    /// was aborted). Their entries stay pending and are delivered again to the next owner.
    pub killed_shards: Vec<ShardId>,
}
