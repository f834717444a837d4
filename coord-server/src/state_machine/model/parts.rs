//! The parts of the modelled world: the group timings, Redis as the coordinator sees it, the shell's memory, the
//! consumer processes, the requests in flight, the fault budget and the actions, with how a step prints them.

use client_core::lease::{Lease, Millis};
use client_core::membership::Membership;
use protocol::messages::{HeartbeatRequest, HeartbeatResponse};
use protocol::metadata::GroupMetadata;
use protocol::names::MemberId;
use protocol::{MetadataVersion, ShardId, Status};

use crate::state_machine::Liveness;

/// Group timings, in logical ms: one time step is one heartbeat interval, a client lease lasts two steps, a
/// member's TTL three, so expiry is a few steps away.
pub const INTERVAL: u64 = 100;
/// The assignment lease.
pub const LEASE: u64 = 200;
/// The member TTL.
pub const TTL: u64 = 300;
/// The rebalance timeout.
pub const REBALANCE: u64 = 300;
pub(super) const START_MS: u64 = 1_000;

/// Redis as the coordinator sees it: the group's metadata and liveness hash, and the run id of the Redis
/// process that wrote them last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redis {
    pub meta: GroupMetadata,
    pub liveness: Liveness,
    pub written_by_run: u32,
}

/// What a coordinator process remembers about the group (lost when it crashes): the shell's part of the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShellMemory {
    pub highest: MetadataVersion,
    pub grace_until: u64,
}

/// An answer waiting in the network for the client whose current request it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Heartbeat(HeartbeatResponse),
    Rejected(Status),
}

/// One consumer process slot; the process may be down. Slots start one per member id; a replacement adds a slot
/// that runs under the member id of the process it replaces, while that one keeps running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// The member id the slot's processes run as (`m<member>`).
    pub member: u8,
    /// The real client rules; `None` while no process runs.
    pub membership: Option<Membership>,
    /// Which process of the slot runs (its instance id is `m<member>-<process>`): bumped by a crash, and by a
    /// start after a graceful leave. A give-back keeps the process (and so its instance id).
    pub process: u32,
    /// Its version store is damaged (or its owner hostile): every request reports a version one above the one
    /// it applied last, a version no coordinator issued.
    pub creeping: bool,
    /// The version store, kept across processes.
    pub stored_max: MetadataVersion,
    pub lease: Lease<Millis>,
    /// Send time of the request the client waits for (one at a time, as the SDK's heartbeat loop).
    pub outstanding: Option<u64>,
    /// The answer to that request, delivered but not yet received.
    pub answer: Option<Answer>,
    /// The last process closed gracefully (a leave was sent).
    pub left: bool,
}

/// A request in the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub from: u8,
    /// Whether its sender still waits for it (a timed-out request, a copy whose twin was answered, or one from a
    /// process that is gone arrives late and its answer is dropped).
    pub current: bool,
    pub sent_at: u64,
    pub req: HeartbeatRequest,
}

/// Budgets of the faults still allowed on this path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub crashes: u8,
    pub coord_crashes: u8,
    pub failovers: u8,
    pub dups: u8,
    pub leaves: u8,
    /// Give-backs: the SDK leaves (Redis unreadable) and rejoins in the same process.
    pub give_backs: u8,
    /// A second process starts under a running process's member id; the first keeps running (stalled, then
    /// resumed: a stall is any stretch of steps it takes no part in).
    pub replacements: u8,
    /// A process's version store is damaged: it reports versions no coordinator issued from then on.
    pub creeps: u8,
    /// The due index (`redis-stream:coord:due`) is damaged (a key of the wrong type, garbage members): no tick
    /// can read it from then on.
    pub index_damages: u8,
}

impl Budget {
    /// No faults at all.
    pub const NONE: Budget = Budget {
        crashes: 0,
        coord_crashes: 0,
        failovers: 0,
        dups: 0,
        leaves: 0,
        give_backs: 0,
        replacements: 0,
        creeps: 0,
        index_damages: 0,
    };
}

/// One atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client sends its next heartbeat; it stays in the network.
    Send(u8),
    /// A whole round trip with no interference: send, deliver, receive.
    RoundTrip(u8),
    /// The coordinator handles request `i` of the network.
    Deliver(usize),
    /// The coordinator handles a duplicate of request `i`; the original stays in the network.
    Duplicate(usize),
    /// Request `i` is lost.
    LoseRequest(usize),
    /// The client receives the answer to its request.
    Receive(u8),
    /// The client gives up waiting (request timeout, or its request or the answer was lost); the request may
    /// still arrive.
    Timeout(u8),
    /// Every draining reader of the client finishes its in-flight work.
    Drain(u8),
    /// Graceful close: stop every reader, send the leave, exit.
    Leave(u8),
    /// The SDK's give-back (Redis unreadable for too long): stop every reader, send the leave without waiting
    /// for it, forget the assignment; the next request joins again from the same process.
    GiveBack(u8),
    /// A new process starts under the member id of slot `i`'s running process, in a slot of its own; the old one
    /// keeps running.
    Replace(u8),
    /// Slot `i`'s version store is damaged: from now on it reports versions no coordinator issued.
    Corrupt(u8),
    /// A process starts in the slot (a new instance id after a crash or a leave).
    Start(u8),
    /// The process dies: its readers stop, its requests may still arrive.
    Crash(u8),
    /// The coordinator's periodic tick.
    Tick,
    /// The due index is damaged for good (wrong type, garbage): the tick's visits must not depend on it.
    DamageDueIndex,
    /// Time moves one interval; client leases and member TTLs may run out.
    Advance,
    /// The coordinator restarts: its memory is lost.
    CoordinatorCrash,
    /// The replica catches up with the primary.
    Replicate,
    /// Failover: the replica (possibly behind) becomes the primary, with a new run id.
    Failover,
}

/// A property violation, with what was seen.
pub type Violation = String;

pub fn member(m: u8) -> MemberId {
    MemberId::new(format!("m{m}")).expect("valid member id")
}

pub(super) fn instance(m: u8, process: u32) -> String {
    format!("m{m}-{process}")
}

pub(super) fn ids(v: &[ShardId]) -> String {
    let parts: Vec<String> = v.iter().map(|s| s.0.to_string()).collect();
    format!("[{}]", parts.join(","))
}

pub fn describe_request(r: &HeartbeatRequest) -> String {
    let revoking: Vec<String> = r
        .revoking
        .iter()
        .map(|x| format!("{}:{:?}", x.shard.0, x.state))
        .collect();
    format!(
        "{} {} epoch {} v{} owned {} revoking [{}]",
        r.member_id,
        r.instance_id,
        r.member_epoch,
        r.metadata_version.0,
        ids(&r.owned),
        revoking.join(",")
    )
}

pub(super) fn describe_answer(a: &Answer) -> String {
    match a {
        Answer::Heartbeat(r) => format!(
            "{} epoch {} v{} assigned {} pending {} revoke {} tokens [{}]",
            r.status,
            r.member_epoch,
            r.metadata_version.0,
            ids(&r.assigned),
            ids(&r.pending),
            ids(&r.revoke),
            r.fencing_tokens
                .iter()
                .map(|t| format!("{}:{}", t.shard.0, t.token))
                .collect::<Vec<_>>()
                .join(",")
        ),
        Answer::Rejected(s) => format!("rejected {s}"),
    }
}
