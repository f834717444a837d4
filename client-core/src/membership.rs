//! The consumer's membership state, built only from coordinator answers and from what its readers report.
//!
//! Pure: no I/O and no clock. The consumer SDK's heartbeat loop feeds it answers and reader exits, and carries out
//! the [`Actions`] it returns (start a reader, stop new reads of a shard). The test models (the coordinator's
//! property test and model check, the wire-level scenario members) drive this same type, so the rules a client
//! follows exist once.
//!
//! # Driving it
//! 1. Send [`Membership::request`] (a join while the epoch is 0), remembering the send time for the lease
//!    ([`crate::lease`]).
//! 2. On an `OK` / `SYNC_METADATA` / `REVOKE_PENDING` answer, call [`Membership::apply`] with whether the lease
//!    that answer grants is still valid, then carry out the [`Actions`]: stop new reads of `drain` *before*
//!    starting `start`, persist `max_observed_grew`, heartbeat again at once if `prompt`.
//! 3. When a reader stops, call [`Membership::reader_stopped`]; on lease expiry [`Membership::revoke_all`]; on
//!    `FENCED_MEMBER_EPOCH` / `UNKNOWN_MEMBER` stop every reader returned by [`Membership::lose_all`] before the
//!    next (join) request.
//!
//! # Shard states
//! ```text
//!            OK assigns it                  not assigned any more / DRAIN /
//!  (absent) ──────────────▶ Reading ───── lease expiry / close ─────▶ Draining
//!     ▲                                                                  │ reader stopped,
//!     │ coordinator no longer                                            │ no work in flight
//!     │ asks for the ack                  a later OK assigns it          ▼
//!     └──────────────────────────────── Revoked ◀────────────────────────┘
//!                                          └──────────────▶ Reading (only on OK)
//! ```
//! `Draining` and `Revoked` are the *local revoking state*: such a shard is never read again until a later `OK`
//! assigns it (and, for `Draining`, its previous reader has stopped). Failing heartbeats, `SYNC_METADATA` and
//! `REVOKE_PENDING` never resume one.
//!
//! # Statuses
//! * `OK`: start `assigned` shards that are not being read; stop reading everything else. `pending` shards are
//!   remembered for display and never read.
//! * `SYNC_METADATA`: adopt the answer's version; keep only shards already being read that are still `assigned`;
//!   revoke the rest; start nothing; heartbeat again at once.
//! * `REVOKE_PENDING`: keep draining; start nothing.

use protocol::messages::{HeartbeatRequest, HeartbeatResponse, RevokeState, RevokingShard};
use protocol::names::MemberId;
use protocol::{
    AssignmentEpoch, FencingToken, Incarnation, MemberEpoch, MetadataVersion, RoutingVersion, ShardId, Status,
};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

/// What the consumer does with one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShardState {
    /// A reader runs and may read.
    Reading,
    /// Local revoking state: no new reads; the reader is finishing its in-flight work.
    Draining,
    /// Local revoking state: the reader stopped with no work in flight.
    Revoked,
}

/// What the heartbeat loop must do after an answer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Actions {
    /// Shards to start reading (a new reader each).
    pub start: Vec<ShardId>,
    /// Shards whose reader must stop new reads and finish its in-flight work.
    pub drain: Vec<ShardId>,
    /// Heartbeat again at once instead of after the interval.
    pub prompt: bool,
    /// The highest observed version grew to this value: persist it in the version store.
    pub max_observed_grew: Option<MetadataVersion>,
}

/// Where a member stands after an answer: what [`Membership::resume`] rebuilds a member at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// The incarnation the answer named.
    pub incarnation: Incarnation,
    /// The member epoch the answer gave.
    pub epoch: MemberEpoch,
    /// The metadata version of the answer.
    pub metadata_version: MetadataVersion,
}

/// Client-side membership: epoch, versions and per-shard state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    member_id: MemberId,
    /// Random per process: lets the coordinator tell another process's join from this one's.
    instance_id: String,
    /// The incarnation every request names: the one the last answer gave, or, while joining, the last one this
    /// process held ([`Incarnation::NONE`] before its first). Kept by [`Membership::lose_all`], so the join that
    /// follows names the incarnation it gives up, and a retry of that join names the same one.
    incarnation: Incarnation,
    /// `0` until the first answer of this incarnation, then the epoch of the last answer.
    epoch: MemberEpoch,
    /// Version of the last applied answer (sent back so the coordinator can spot a stale view).
    metadata_version: MetadataVersion,
    /// Highest version ever observed, including earlier processes (from the version store).
    max_observed: MetadataVersion,
    assignment_epoch: AssignmentEpoch,
    shards: BTreeMap<ShardId, ShardState>,
    /// The fencing token each shard was last started with. Kept for the whole read: a later answer may carry a
    /// higher token for a shard being read (the coordinator re-mints when a correction round closes), but no other
    /// member can hold the shard while this one reads it, so the token it started with still fences everyone
    /// before it.
    tokens: BTreeMap<ShardId, FencingToken>,
    /// Shards targeted to this member that a previous owner still holds (never read).
    pending: Vec<ShardId>,
    /// The highest routing version and shard count the answers showed (or the process remembered): reported in
    /// every request, so a coordinator learns of a growth Redis lost (see [`docs/resharding.md`]).
    ///
    /// [`docs/resharding.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/resharding.md
    routing_seen: (RoutingVersion, u32),
    /// Shutting down: nothing new is started.
    closing: bool,
    /// Whether an answer was received since the last (re)join.
    joined: bool,
    last_status: Option<Status>,
}

impl Membership {
    /// A member that has not joined yet. `max_observed` comes from the version store.
    pub fn new(member_id: MemberId, instance_id: String, max_observed: MetadataVersion) -> Self {
        Membership {
            member_id,
            instance_id,
            incarnation: Incarnation::NONE,
            epoch: MemberEpoch::JOIN,
            metadata_version: MetadataVersion::default(),
            max_observed,
            assignment_epoch: AssignmentEpoch::default(),
            shards: BTreeMap::new(),
            tokens: BTreeMap::new(),
            pending: Vec::new(),
            routing_seen: (RoutingVersion(0), 0),
            closing: false,
            joined: false,
            last_status: None,
        }
    }

    /// A member rebuilt from its parts, for drivers that keep the state themselves (the wire-level test members
    /// of the scenario suite) and let these rules decide the next state. Shards listed twice take the last
    /// state given (`reading`, then `draining`, then `revoked`); readers start with token 0.
    pub fn resume(
        member_id: MemberId,
        instance_id: String,
        max_observed: MetadataVersion,
        standing: Standing,
        shards: [&[ShardId]; 3],
    ) -> Self {
        let mut m = Membership::new(member_id, instance_id, max_observed);
        m.incarnation = standing.incarnation;
        m.epoch = standing.epoch;
        m.metadata_version = standing.metadata_version;
        m.joined = !standing.epoch.is_join();
        let [reading, draining, revoked] = shards;
        for (list, state) in [
            (reading, ShardState::Reading),
            (draining, ShardState::Draining),
            (revoked, ShardState::Revoked),
        ] {
            for &shard in list {
                m.shards.insert(shard, state);
            }
        }
        m
    }

    /// The next heartbeat (a join while the epoch is 0).
    pub fn request(&self) -> HeartbeatRequest {
        HeartbeatRequest {
            member_id: self.member_id.clone(),
            instance_id: self.instance_id.clone(),
            incarnation: self.incarnation,
            member_epoch: self.epoch,
            metadata_version: self.metadata_version,
            max_observed_version: self.max_observed.max(self.metadata_version),
            owned: self.shards_in(ShardState::Reading),
            revoking: self
                .shards
                .iter()
                .filter_map(|(&shard, &state)| {
                    let state = match state {
                        ShardState::Reading => return None,
                        ShardState::Draining => RevokeState::Draining,
                        ShardState::Revoked => RevokeState::Revoked,
                    };
                    Some(RevokingShard { shard, state })
                })
                .collect(),
            max_routing_version: self.routing_seen.0,
            max_shard_count: self.routing_seen.1,
        }
    }

    /// The leave request (epoch -1). Sent only after every reader stopped, so every shard is reported revoked.
    pub fn leave_request(&self) -> HeartbeatRequest {
        let mut req = self.request();
        req.member_epoch = MemberEpoch::LEAVE;
        req.owned.clear();
        for r in &mut req.revoking {
            r.state = RevokeState::Revoked;
        }
        req
    }

    /// Applies an `OK`, `SYNC_METADATA` or `REVOKE_PENDING` answer. `can_start` says whether the lease granted
    /// by this answer is still valid (an answer that arrives after its own lease ran out starts nothing).
    pub fn apply(&mut self, resp: &HeartbeatResponse, can_start: bool) -> Actions {
        let mut actions = Actions::default();
        self.observe_routing(resp.routing_version, resp.shard_count);
        self.incarnation = resp.incarnation;
        self.epoch = resp.member_epoch;
        self.assignment_epoch = resp.assignment_epoch;
        // Adopted even when lower: after a rollback the coordinator's answer is the truth (SYNC_METADATA).
        self.metadata_version = resp.metadata_version;
        if resp.metadata_version > self.max_observed {
            self.max_observed = resp.metadata_version;
            actions.max_observed_grew = Some(resp.metadata_version);
        }
        self.joined = true;
        self.last_status = Some(resp.status);
        self.pending = resp.pending.clone();

        let assigned: BTreeSet<ShardId> = resp.assigned.iter().copied().collect();
        let revoke: BTreeSet<ShardId> = resp.revoke.iter().copied().collect();

        // Whatever the status: a shard being read that the answer does not assign is no longer ours to read (the
        // DRAIN list, a SYNC_METADATA view without it, a pending shard, a shard someone else owns).
        for (&shard, state) in &mut self.shards {
            if *state == ShardState::Reading && !assigned.contains(&shard) {
                *state = ShardState::Draining;
                actions.drain.push(shard);
            }
        }
        // DRAIN of a shard this process does not read (after a SYNC_METADATA, a rejoin, a lease expiry that
        // already ended its reader): nothing is in flight, so it is revoked at once; report it now.
        for &shard in &revoke {
            if let Entry::Vacant(e) = self.shards.entry(shard) {
                e.insert(ShardState::Revoked);
                actions.prompt = true;
            }
        }
        // A revoked shard whose ack the coordinator no longer asks for is released: forget it.
        self.shards
            .retain(|shard, state| *state != ShardState::Revoked || revoke.contains(shard) || assigned.contains(shard));

        match resp.status {
            Status::Ok if can_start && !self.closing => {
                for &shard in &assigned {
                    match self.shards.get(&shard) {
                        None | Some(ShardState::Revoked) => {
                            self.shards.insert(shard, ShardState::Reading);
                            let token = resp.fencing_tokens.iter().find(|t| t.shard == shard).map(|t| t.token);
                            self.tokens.insert(shard, token.unwrap_or_default());
                            actions.start.push(shard);
                        }
                        // Restarted once its previous reader has stopped (that exit triggers a prompt heartbeat).
                        Some(ShardState::Draining) | Some(ShardState::Reading) => {}
                    }
                }
            }
            Status::SyncMetadata => actions.prompt = true,
            _ => {}
        }
        actions
    }

    /// A reader stopped (drained or killed). Returns whether the shard became `Revoked` now, which is worth a
    /// prompt heartbeat: the coordinator can hand it over as soon as it hears about it.
    pub fn reader_stopped(&mut self, shard: ShardId) -> bool {
        match self.shards.get_mut(&shard) {
            Some(state @ (ShardState::Reading | ShardState::Draining)) => {
                *state = ShardState::Revoked;
                true
            }
            _ => false,
        }
    }

    /// Puts every shard into local revoking state (lease expiry, shutdown). Returns the shards that still have
    /// a reader (to stop).
    pub fn revoke_all(&mut self) -> Vec<ShardId> {
        let mut with_reader = Vec::new();
        for (&shard, state) in &mut self.shards {
            match state {
                ShardState::Reading | ShardState::Draining => {
                    *state = ShardState::Draining;
                    with_reader.push(shard);
                }
                ShardState::Revoked => {}
            }
        }
        with_reader
    }

    /// The member was fenced or forgotten, or gives its shards back: every shard is lost and the next heartbeat
    /// joins again (epoch 0, same instance id, same versions), naming the incarnation it gives up, so the
    /// coordinator makes a new one (a late request of the old one then changes nothing). Returns the shards that
    /// had a reader. The caller must stop those readers before it sends the join.
    pub fn lose_all(&mut self) -> Vec<ShardId> {
        let lost = self
            .shards
            .iter()
            .filter(|(_, s)| **s != ShardState::Revoked)
            .map(|(&shard, _)| shard)
            .collect();
        self.shards.clear();
        self.tokens.clear();
        self.pending.clear();
        self.epoch = MemberEpoch::JOIN;
        self.joined = false;
        lost
    }

    /// Shutting down: nothing new starts from now on.
    pub fn set_closing(&mut self) {
        self.closing = true;
    }

    /// The member left: nothing is owned or reported any more.
    pub fn set_left(&mut self) {
        self.shards.clear();
        self.tokens.clear();
        self.pending.clear();
        self.epoch = MemberEpoch::LEAVE;
        self.joined = false;
    }

    /// Records the status of a failed heartbeat (for display).
    pub fn record_status(&mut self, status: Status) {
        self.last_status = Some(status);
    }

    /// The state of `shard`, if the member knows it.
    pub fn state(&self, shard: ShardId) -> Option<ShardState> {
        self.shards.get(&shard).copied()
    }

    /// Shards in `state`, in order.
    pub fn shards_in(&self, state: ShardState) -> Vec<ShardId> {
        self.shards
            .iter()
            .filter(|(_, s)| **s == state)
            .map(|(&shard, _)| shard)
            .collect()
    }

    /// Shards in local revoking state (draining or revoked), in order.
    pub fn revoking(&self) -> Vec<ShardId> {
        self.shards
            .iter()
            .filter(|(_, s)| **s != ShardState::Reading)
            .map(|(&shard, _)| shard)
            .collect()
    }

    /// Whether no reader runs (every known shard is revoked).
    pub fn all_stopped(&self) -> bool {
        self.shards.values().all(|s| *s == ShardState::Revoked)
    }

    /// The fencing token `shard` was last started with (`0` if the coordinator sent none).
    pub fn token(&self, shard: ShardId) -> FencingToken {
        self.tokens.get(&shard).copied().unwrap_or_default()
    }

    /// Shards targeted to the member but still held by a previous owner.
    pub fn pending(&self) -> &[ShardId] {
        &self.pending
    }

    /// The member id.
    pub fn member_id(&self) -> &MemberId {
        &self.member_id
    }

    /// The instance id (one per process).
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// Raises the highest routing version and shard count this member reports (e.g. from what the process
    /// remembers). Never lowers them.
    pub fn observe_routing(&mut self, version: RoutingVersion, shard_count: u32) {
        self.routing_seen = (self.routing_seen.0.max(version), self.routing_seen.1.max(shard_count));
    }

    /// The highest routing version and shard count seen.
    pub fn routing_seen(&self) -> (RoutingVersion, u32) {
        self.routing_seen
    }

    /// The incarnation the next request names (see [`Incarnation`]).
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// The epoch the next heartbeat carries.
    pub fn epoch(&self) -> MemberEpoch {
        self.epoch
    }

    /// Version of the last applied answer.
    pub fn metadata_version(&self) -> MetadataVersion {
        self.metadata_version
    }

    /// Highest version ever observed.
    pub fn max_observed(&self) -> MetadataVersion {
        self.max_observed
    }

    /// Assignment epoch of the last applied answer.
    pub fn assignment_epoch(&self) -> AssignmentEpoch {
        self.assignment_epoch
    }

    /// Whether an answer was received since the last (re)join.
    pub fn is_joined(&self) -> bool {
        self.joined
    }

    /// Status of the last heartbeat (answer or error).
    pub fn last_status(&self) -> Option<Status> {
        self.last_status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::RoutingVersion;

    fn member() -> Membership {
        Membership::new(MemberId::new("m1").unwrap(), "inst-1".into(), MetadataVersion(0))
    }

    fn ids(v: &[u32]) -> Vec<ShardId> {
        v.iter().map(|&s| ShardId(s)).collect()
    }

    fn resp(status: Status, version: u64, assigned: &[u32], pending: &[u32], revoke: &[u32]) -> HeartbeatResponse {
        HeartbeatResponse {
            status,
            member_id: MemberId::new("m1").unwrap(),
            incarnation: Incarnation(7),
            member_epoch: MemberEpoch(3),
            metadata_version: MetadataVersion(version),
            assignment_epoch: AssignmentEpoch(3),
            assigned: ids(assigned),
            fencing_tokens: assigned
                .iter()
                .map(|&s| protocol::messages::ShardToken {
                    shard: ShardId(s),
                    token: FencingToken(1_000 + u64::from(s)),
                })
                .collect(),
            pending: ids(pending),
            revoke: ids(revoke),
            heartbeat_interval_ms: 200,
            assignment_lease_ms: 1500,
            shard_count: 8,
            routing_version: RoutingVersion(1),
        }
    }

    fn revoking(m: &Membership) -> Vec<(u32, RevokeState)> {
        m.request().revoking.iter().map(|r| (r.shard.0, r.state)).collect()
    }

    #[test]
    fn first_request_is_a_join_carrying_the_stored_max_version() {
        let m = Membership::new(MemberId::new("m1").unwrap(), "inst-1".into(), MetadataVersion(42));
        let req = m.request();
        assert_eq!(req.member_epoch, MemberEpoch::JOIN);
        assert_eq!(req.metadata_version, MetadataVersion(0));
        assert_eq!(req.max_observed_version, MetadataVersion(42));
        assert_eq!(req.instance_id, "inst-1");
        assert!(req.owned.is_empty() && req.revoking.is_empty());
        assert!(!m.is_joined());
    }

    #[test]
    fn ok_starts_assigned_shards_and_never_pending_ones() {
        let mut m = member();
        let a = m.apply(&resp(Status::Ok, 5, &[0, 1], &[2, 3], &[]), true);
        assert_eq!(a.start, ids(&[0, 1]));
        assert!(a.drain.is_empty());
        assert_eq!(a.max_observed_grew, Some(MetadataVersion(5)));
        assert_eq!(m.shards_in(ShardState::Reading), ids(&[0, 1]));
        assert_eq!(m.pending(), ids(&[2, 3]).as_slice());
        let req = m.request();
        assert_eq!(req.member_epoch, MemberEpoch(3));
        assert_eq!(req.metadata_version, MetadataVersion(5));
        assert_eq!(req.owned, ids(&[0, 1]));
        // The same answer again (a repeated view) starts nothing twice.
        let again = m.apply(&resp(Status::Ok, 5, &[0, 1], &[2, 3], &[]), true);
        assert_eq!(again, Actions::default());
    }

    #[test]
    fn a_reader_starts_with_its_shards_token_and_keeps_it_while_reading() {
        let mut m = member();
        m.apply(&resp(Status::Ok, 5, &[0, 1], &[], &[]), true);
        assert_eq!(m.token(ShardId(0)), FencingToken(1_000));
        assert_eq!(m.token(ShardId(1)), FencingToken(1_001));
        // A higher token for a shard still being read (a correction round closed): the reader keeps its own.
        let mut higher = resp(Status::Ok, 6, &[0, 1], &[], &[]);
        higher.fencing_tokens[0].token = FencingToken(9_000);
        m.apply(&higher, true);
        assert_eq!(m.token(ShardId(0)), FencingToken(1_000));
        // Drained, released, assigned again: the new reader gets the new token.
        m.apply(&resp(Status::Ok, 7, &[1], &[], &[0]), true);
        m.reader_stopped(ShardId(0));
        m.apply(&resp(Status::Ok, 8, &[1], &[], &[]), true);
        let a = m.apply(&higher, true);
        assert_eq!(a.start, ids(&[0]));
        assert_eq!(m.token(ShardId(0)), FencingToken(9_000));
        // An older coordinator sends no tokens.
        let mut none = resp(Status::Ok, 9, &[2], &[], &[]);
        none.fencing_tokens.clear();
        m.apply(&none, true);
        assert_eq!(m.token(ShardId(2)), FencingToken(0));
    }

    #[test]
    fn ok_after_its_own_lease_ran_out_starts_nothing() {
        let mut m = member();
        let a = m.apply(&resp(Status::Ok, 5, &[0, 1], &[], &[]), false);
        assert!(a.start.is_empty());
        assert!(m.is_joined());
    }

    #[test]
    fn drain_stops_new_reads_then_reports_draining_then_revoked() {
        let mut m = member();
        m.apply(&resp(Status::Ok, 5, &[0, 1], &[], &[]), true);
        let a = m.apply(&resp(Status::Ok, 6, &[0], &[], &[1]), true);
        assert_eq!(a.drain, ids(&[1]));
        assert!(a.start.is_empty());
        assert_eq!(m.request().owned, ids(&[0]));
        assert_eq!(revoking(&m), vec![(1, RevokeState::Draining)]);
        assert!(
            m.reader_stopped(ShardId(1)),
            "draining -> revoked is worth a prompt heartbeat"
        );
        assert!(!m.reader_stopped(ShardId(1)), "only once");
        assert_eq!(revoking(&m), vec![(1, RevokeState::Revoked)]);
        // The coordinator still asks: keep reporting.
        m.apply(&resp(Status::Ok, 6, &[0], &[], &[1]), true);
        assert_eq!(revoking(&m), vec![(1, RevokeState::Revoked)]);
        // Released: forgotten.
        m.apply(&resp(Status::Ok, 7, &[0], &[], &[]), true);
        assert!(revoking(&m).is_empty());
        assert_eq!(m.state(ShardId(1)), None);
    }

    #[test]
    fn drain_of_a_shard_not_read_is_acknowledged_at_once() {
        let mut m = member();
        m.apply(&resp(Status::Ok, 5, &[0], &[], &[]), true);
        // Redis (after a rollback) records this member as the owner of 3, which it never read in this process.
        let a = m.apply(&resp(Status::SyncMetadata, 4, &[0], &[], &[3]), true);
        assert!(a.drain.is_empty(), "no reader to stop");
        assert!(a.prompt);
        assert_eq!(revoking(&m), vec![(3, RevokeState::Revoked)]);
        m.apply(&resp(Status::Ok, 6, &[0], &[], &[]), true);
        assert!(revoking(&m).is_empty(), "forgotten once released");
    }

    #[test]
    fn reading_shard_missing_from_assigned_is_drained_even_without_a_revoke_entry() {
        let mut m = member();
        m.apply(&resp(Status::Ok, 5, &[0, 1], &[], &[]), true);
        // Shard 1 became pending (held by a predecessor): not readable.
        let a = m.apply(&resp(Status::Ok, 6, &[0], &[1], &[]), true);
        assert_eq!(a.drain, ids(&[1]));
    }

    #[test]
    fn sync_metadata_keeps_only_still_assigned_shards_and_starts_nothing() {
        let mut m = member();
        m.apply(&resp(Status::Ok, 10, &[0, 1, 2], &[], &[]), true);
        let a = m.apply(&resp(Status::SyncMetadata, 9, &[0, 1, 5], &[2], &[]), true);
        assert_eq!(a.drain, ids(&[2]), "2 is not assigned any more");
        assert!(a.start.is_empty(), "5 is assigned but SYNC_METADATA starts nothing");
        assert!(a.prompt, "heartbeat again with the corrected version");
        assert_eq!(a.max_observed_grew, None);
        let req = m.request();
        assert_eq!(
            req.metadata_version,
            MetadataVersion(9),
            "the stored version is adopted"
        );
        assert_eq!(
            req.max_observed_version,
            MetadataVersion(10),
            "the highest observed one is kept"
        );
        assert_eq!(req.owned, ids(&[0, 1]));
    }

    #[test]
    fn revoke_pending_keeps_draining_and_starts_nothing() {
        let mut m = member();
        m.apply(&resp(Status::Ok, 10, &[0, 1], &[], &[]), true);
        m.apply(&resp(Status::SyncMetadata, 9, &[0], &[], &[1]), true);
        let a = m.apply(&resp(Status::RevokePending, 9, &[0, 3], &[], &[1]), true);
        assert!(a.start.is_empty());
        assert!(!a.prompt);
        assert_eq!(revoking(&m), vec![(1, RevokeState::Draining)]);
        m.reader_stopped(ShardId(1));
        let a = m.apply(&resp(Status::Ok, 11, &[0, 3], &[], &[]), true);
        assert_eq!(a.start, ids(&[3]), "OK is the only status that starts shards");
    }

    #[test]
    fn revoking_shard_resumes_only_on_a_later_ok_that_assigns_it() {
        let mut m = member();
        m.apply(&resp(Status::Ok, 5, &[0, 1], &[], &[]), true);
        // Lease ran out: everything enters local revoking state.
        assert_eq!(m.revoke_all(), ids(&[0, 1]));
        assert!(m.request().owned.is_empty());
        // Still draining when an OK assigns them again: not restarted until the old reader stopped.
        let a = m.apply(&resp(Status::Ok, 5, &[0, 1], &[], &[]), true);
        assert!(a.start.is_empty());
        m.reader_stopped(ShardId(0));
        m.reader_stopped(ShardId(1));
        // REVOKE_PENDING / SYNC do not resume.
        assert!(m
            .apply(&resp(Status::RevokePending, 5, &[0, 1], &[], &[]), true)
            .start
            .is_empty());
        assert!(m
            .apply(&resp(Status::SyncMetadata, 5, &[0, 1], &[], &[]), true)
            .start
            .is_empty());
        // OK does.
        let a = m.apply(&resp(Status::Ok, 6, &[0, 1], &[], &[]), true);
        assert_eq!(a.start, ids(&[0, 1]));
        assert_eq!(m.request().owned, ids(&[0, 1]));
    }

    #[test]
    fn closing_starts_nothing() {
        let mut m = member();
        m.apply(&resp(Status::Ok, 5, &[0], &[], &[]), true);
        m.set_closing();
        assert_eq!(m.revoke_all(), ids(&[0]));
        m.reader_stopped(ShardId(0));
        let a = m.apply(&resp(Status::Ok, 5, &[0, 1], &[], &[]), true);
        assert!(a.start.is_empty());
        assert!(m.all_stopped());
        let leave = m.leave_request();
        assert_eq!(leave.member_epoch, MemberEpoch::LEAVE);
        assert!(leave.owned.is_empty());
        assert_eq!(
            leave.revoking,
            vec![RevokingShard {
                shard: ShardId(0),
                state: RevokeState::Revoked
            }]
        );
    }

    #[test]
    fn lost_member_rejoins_with_epoch_zero_and_keeps_its_versions() {
        let mut m = member();
        m.apply(&resp(Status::Ok, 5, &[0, 1], &[], &[]), true);
        m.apply(&resp(Status::Ok, 6, &[0], &[], &[1]), true);
        m.reader_stopped(ShardId(1));
        assert_eq!(m.lose_all(), ids(&[0]), "only shards with a reader are lost");
        let req = m.request();
        assert_eq!(req.member_epoch, MemberEpoch::JOIN);
        assert_eq!(req.instance_id, "inst-1", "same process, same instance id");
        assert_eq!(
            req.incarnation,
            Incarnation(7),
            "the join names the incarnation it gives up, so the coordinator makes a new one"
        );
        assert_eq!(req.metadata_version, MetadataVersion(6));
        assert!(req.owned.is_empty() && req.revoking.is_empty());
        assert!(!m.is_joined());
    }

    #[test]
    fn every_request_names_the_incarnation_its_join_was_given() {
        let mut m = member();
        let join = m.request();
        assert_eq!(
            (join.member_epoch, join.incarnation),
            (MemberEpoch::JOIN, Incarnation::NONE)
        );
        // The join's answer was lost: the retry is the same join.
        assert_eq!(m.request(), join);
        m.apply(&resp(Status::Ok, 5, &[0], &[], &[]), true);
        assert_eq!(m.request().incarnation, Incarnation(7));
        assert_eq!(m.leave_request().incarnation, Incarnation(7));
    }

    #[test]
    fn a_resumed_member_sends_what_it_was_given() {
        let standing = Standing {
            incarnation: Incarnation(7),
            epoch: MemberEpoch(4),
            metadata_version: MetadataVersion(7),
        };
        let m = Membership::resume(
            MemberId::new("m1").unwrap(),
            "inst-1".into(),
            MetadataVersion(9),
            standing,
            [&ids(&[0, 1]), &ids(&[2]), &ids(&[3])],
        );
        let req = m.request();
        assert_eq!(
            (req.member_epoch, req.metadata_version),
            (MemberEpoch(4), MetadataVersion(7))
        );
        assert_eq!(req.max_observed_version, MetadataVersion(9));
        assert_eq!(req.owned, ids(&[0, 1]));
        assert_eq!(
            revoking(&m),
            vec![(2, RevokeState::Draining), (3, RevokeState::Revoked)]
        );
        assert!(m.is_joined());
    }

    #[test]
    fn max_observed_never_goes_down() {
        let mut m = member();
        assert_eq!(
            m.apply(&resp(Status::Ok, 8, &[], &[], &[]), true).max_observed_grew,
            Some(MetadataVersion(8))
        );
        assert_eq!(
            m.apply(&resp(Status::SyncMetadata, 3, &[], &[], &[]), true)
                .max_observed_grew,
            None
        );
        assert_eq!(m.max_observed(), MetadataVersion(8));
        assert_eq!(m.metadata_version(), MetadataVersion(3));
    }
}
