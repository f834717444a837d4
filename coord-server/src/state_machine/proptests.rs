//! Property test: random sequences of joins, heartbeats, lost answers, drains, crashes, leaves, time, ticks,
//! coordinator restarts and Redis rollbacks, with clients that run the SDK's own membership and lease rules
//! ([`client_core::membership`], [`client_core::lease`] on logical time). The network loses
//! answers, and also delays, duplicates and reorders requests: a request the client timed out (or a duplicate of
//! one it got an answer to) reaches the coordinator later, in any order. After every step: no shard is read (or
//! drained) by two clients whose leases are valid; every client that starts reading a shard holds a fencing token
//! above every token an earlier reader of the shard held (across rollbacks too); a late request opens no
//! correction round unless Redis lost writes since it was sent; after a quiet period with stable membership no
//! live client is fenced and every shard is read by exactly one live client.

use client_core::lease::{Lease, Millis};
use client_core::membership::{Membership, ShardState};
use proptest::prelude::*;
use protocol::messages::HeartbeatRequest;
use protocol::names::MemberId;
use protocol::{FencingToken, MetadataVersion, ShardId};
use std::collections::BTreeMap;
use std::time::Duration;

use super::harness::{Harness, INTERVAL, TTL};
use super::transition::{Event, Liveness, Outcome};
use super::Input;
use protocol::metadata::GroupMetadata;

const MEMBERS: u8 = 4;

#[derive(Debug, Clone)]
enum Op {
    Join(u8),
    Heartbeat {
        m: u8,
        lose: bool,
        dup: bool,
    },
    /// The client's request is delayed in the network: it times out (no answer) and arrives later, if ever.
    Delay(u8),
    /// One delayed request (chosen by index) reaches the coordinator; its answer goes nowhere.
    Deliver(u8),
    Drain(u8),
    Crash {
        m: u8,
        keep_versions: bool,
    },
    Leave(u8),
    Advance(u16),
    Tick,
    Snapshot,
    Rollback,
    CoordinatorRestart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..MEMBERS).prop_map(Op::Join),
        10 => (0..MEMBERS, prop::bool::weighted(0.2), prop::bool::weighted(0.15))
            .prop_map(|(m, lose, dup)| Op::Heartbeat { m, lose, dup }),
        2 => (0..MEMBERS).prop_map(Op::Delay),
        3 => any::<u8>().prop_map(Op::Deliver),
        4 => (0..MEMBERS).prop_map(Op::Drain),
        1 => (0..MEMBERS, any::<bool>()).prop_map(|(m, keep_versions)| Op::Crash { m, keep_versions }),
        1 => (0..MEMBERS).prop_map(Op::Leave),
        6 => (1u16..4000).prop_map(Op::Advance),
        4 => Just(Op::Tick),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Rollback),
        1 => Just(Op::CoordinatorRestart),
    ]
}

/// A consumer process: the SDK's membership rules and lease, on the harness's clock.
#[derive(Debug, Clone, Default)]
struct Client {
    /// `None` while no process runs under this member id.
    membership: Option<Membership>,
    incarnation: u32,
    /// What the version store keeps across processes.
    stored_max: MetadataVersion,
    lease: Lease<Millis>,
}

impl Client {
    fn alive(&self) -> bool {
        self.membership.is_some()
    }

    /// Shards with a reader (reading or draining).
    fn with_reader(&self) -> Vec<ShardId> {
        self.membership.as_ref().map_or_else(Vec::new, |m| {
            let mut v = m.shards_in(ShardState::Reading);
            v.extend(m.shards_in(ShardState::Draining));
            v
        })
    }

    fn reading(&self) -> Vec<ShardId> {
        self.membership
            .as_ref()
            .map_or_else(Vec::new, |m| m.shards_in(ShardState::Reading))
    }
}

/// A request in the network, with the number of Redis rollbacks before it was sent.
#[derive(Debug, Clone)]
struct InFlight {
    req: HeartbeatRequest,
    rollbacks: u32,
}

/// At most this many requests wait in the network (older ones are dropped, as a real network would).
const MAX_IN_FLIGHT: usize = 6;

struct World {
    h: Harness,
    clients: Vec<Client>,
    snapshot: Option<(GroupMetadata, Liveness)>,
    in_flight: Vec<InFlight>,
    rollbacks: u32,
    /// By shard: the last reader (client, incarnation) and the highest token any reader held, in any history.
    readers: BTreeMap<ShardId, ((usize, u32), FencingToken)>,
}

fn name(m: u8) -> MemberId {
    MemberId::new(format!("m{m}")).unwrap()
}

impl World {
    fn new(shards: u32) -> Self {
        World {
            h: Harness::new(shards),
            clients: vec![Client::default(); MEMBERS as usize],
            snapshot: None,
            in_flight: Vec::new(),
            rollbacks: 0,
            readers: BTreeMap::new(),
        }
    }

    fn request(&self, m: u8) -> HeartbeatRequest {
        self.clients[m as usize]
            .membership
            .as_ref()
            .expect("only a running client sends")
            .request()
    }

    fn send_late(&mut self, req: HeartbeatRequest) {
        if self.in_flight.len() == MAX_IN_FLIGHT {
            self.in_flight.remove(0);
        }
        self.in_flight.push(InFlight {
            req,
            rollbacks: self.rollbacks,
        });
    }

    /// A delayed request arrives. The client gave up on it, so the answer is dropped. Unless Redis lost writes
    /// since it was sent, it must not open a correction round: it carries nothing the coordinator has not seen.
    fn deliver(&mut self, index: usize, history: &[Op]) {
        if self.in_flight.is_empty() {
            return;
        }
        let late = self.in_flight.remove(index % self.in_flight.len());
        // A join of an incarnation that has since been replaced would replace its successor: the request carries
        // nothing that tells it from a new process taking the member id over (see design-decisions.md).
        let current = self.clients.iter().enumerate().any(|(i, c)| {
            late.req.member_id == name(i as u8) && late.req.instance_id == format!("m{i}-{}", c.incarnation)
        });
        if late.req.member_epoch.is_join() && !current {
            return;
        }
        let suspected = self.h.suspected.is_some();
        let t = self.h.apply(Input::Heartbeat(&late.req));
        if late.rollbacks == self.rollbacks && !suspected {
            assert!(
                !t.events.iter().any(|e| matches!(e, Event::CorrectionOpened { .. })),
                "a late request opened a correction round: {:?}\nevents {:?}\nops: {history:#?}",
                late.req,
                t.events
            );
        }
    }

    fn heartbeat(&mut self, m: u8, lose: bool) {
        self.heartbeat_dup(m, lose, false);
    }

    fn heartbeat_dup(&mut self, m: u8, lose: bool, dup: bool) {
        if !self.clients[m as usize].alive() {
            return;
        }
        let sent_at = Millis(self.h.now);
        let req = self.request(m);
        if dup {
            self.send_late(req.clone());
        }
        let t = self.h.apply(Input::Heartbeat(&req));
        if lose {
            return;
        }
        let now = Millis(self.h.now);
        let c = &mut self.clients[m as usize];
        let reader = (m as usize, c.incarnation);
        let membership = c.membership.as_mut().expect("alive");
        match t.outcome {
            Outcome::Heartbeat(r) => {
                c.lease.grant(sent_at, Duration::from_millis(r.assignment_lease_ms));
                let actions = membership.apply(&r, c.lease.is_valid_at(now));
                c.stored_max = c.stored_max.max(membership.max_observed());
                for s in actions.start {
                    assert!(
                        r.fencing_tokens.iter().any(|t| t.shard == s),
                        "no token for assigned shard {s}: {r:?}"
                    );
                    check_token(&mut self.readers, s, reader, membership.token(s));
                }
            }
            Outcome::Rejected(r) => {
                assert!(r.status.requires_rejoin(), "unexpected rejection {r:?}");
                // The SDK stops every reader before it sends the join.
                membership.lose_all();
                c.lease.revoke();
            }
            Outcome::Done => unreachable!(),
        }
    }

    fn step(&mut self, op: &Op, history: &[Op]) {
        match *op {
            Op::Join(m) => {
                let c = &mut self.clients[m as usize];
                if !c.alive() {
                    c.incarnation += 1;
                    c.membership = Some(Membership::new(
                        name(m),
                        format!("m{m}-{}", c.incarnation),
                        c.stored_max,
                    ));
                    c.lease = Lease::default();
                }
                self.heartbeat(m, false);
            }
            Op::Heartbeat { m, lose, dup } => self.heartbeat_dup(m, lose, dup),
            Op::Delay(m) => {
                if self.clients[m as usize].alive() {
                    let req = self.request(m);
                    self.send_late(req);
                }
            }
            Op::Deliver(i) => self.deliver(usize::from(i), history),
            Op::Drain(m) => {
                if let Some(membership) = self.clients[m as usize].membership.as_mut() {
                    for s in membership.shards_in(ShardState::Draining) {
                        membership.reader_stopped(s);
                    }
                }
            }
            Op::Crash { m, keep_versions } => {
                let c = &mut self.clients[m as usize];
                c.membership = None;
                c.lease = Lease::default();
                if !keep_versions {
                    c.stored_max = MetadataVersion(0);
                }
            }
            Op::Leave(m) => {
                let c = &mut self.clients[m as usize];
                let Some(membership) = c.membership.as_mut() else {
                    return;
                };
                // The SDK's close: nothing new starts, every reader stops, then the leave is sent.
                membership.set_closing();
                for s in membership.revoke_all() {
                    membership.reader_stopped(s);
                }
                let req = membership.leave_request();
                c.membership = None;
                c.lease = Lease::default();
                self.h.apply(Input::Heartbeat(&req));
            }
            Op::Advance(ms) => self.h.advance(u64::from(ms)),
            Op::Tick => {
                self.h.tick();
            }
            Op::Snapshot => self.snapshot = Some((self.h.meta.clone(), self.h.liveness.clone())),
            Op::Rollback => {
                if let Some((meta, live)) = self.snapshot.take() {
                    // A failover or restart: the coordinator notices by the run id stored with the metadata, or
                    // by its own memory of a higher version.
                    self.h.suspected = Some(self.h.meta.metadata_version.max(meta.metadata_version));
                    self.h.meta = meta;
                    self.h.liveness = live;
                    // The coordinator notices the regression (or restarts): grace.
                    self.h.grace_until = self.h.now + TTL;
                    self.rollbacks += 1;
                }
            }
            Op::CoordinatorRestart => self.h.grace_until = self.h.now + TTL,
        }
        self.expire_client_leases();
    }

    /// The SDK rule: when the lease runs out without an answer, stop reading everything (in-flight work is cut
    /// by the readers' own lease check).
    fn expire_client_leases(&mut self) {
        let now = Millis(self.h.now);
        for c in &mut self.clients {
            if let Some(membership) = c.membership.as_mut() {
                if !c.lease.is_valid_at(now) {
                    for s in membership.revoke_all() {
                        membership.reader_stopped(s);
                    }
                }
            }
        }
    }

    fn check_no_split(&self, history: &[Op]) {
        let mut readers: BTreeMap<ShardId, Vec<usize>> = BTreeMap::new();
        for (i, c) in self.clients.iter().enumerate() {
            for s in c.with_reader() {
                readers.entry(s).or_default().push(i);
            }
        }
        for (shard, who) in readers {
            assert!(
                who.len() <= 1,
                "shard {shard} is read by clients {who:?} at {}\nops: {history:#?}",
                self.h.now
            );
        }
    }

    /// No more faults: everyone heartbeats regularly and drains promptly. After a warm-up longer than the
    /// rebalance timeout every live client is healthy; then the requests still in the network arrive, late, and
    /// nothing may fence a live client from then on.
    fn settle(&mut self, history: &[Op]) {
        const WARM_UP: u32 = 8;
        for round in 0..60 {
            if round == WARM_UP {
                while !self.in_flight.is_empty() {
                    self.deliver(0, history);
                    self.check_no_split(history);
                }
            }
            self.h.advance(INTERVAL);
            for m in 0..MEMBERS {
                self.step(&Op::Drain(m), history);
                self.heartbeat(m, false);
                self.check_no_split(history);
            }
            let t = self.h.tick();
            let alive: Vec<MemberId> = (0..MEMBERS)
                .filter(|&m| self.clients[m as usize].alive())
                .map(name)
                .collect();
            let fenced: Vec<&Event> = t
                .events
                .iter()
                .filter(|e| matches!(e, Event::MemberFenced { member, .. } if alive.contains(member)))
                .collect();
            assert!(
                round < WARM_UP || fenced.is_empty(),
                "a healthy member was fenced at {}: {fenced:?}\nops: {history:#?}",
                self.h.now
            );
        }
    }
}

/// A reader that starts a shard needs a token above every token an earlier reader of it held; only the same
/// process resuming the shard (nobody read it in between) may hold the same one again.
fn check_token(
    readers: &mut BTreeMap<ShardId, ((usize, u32), FencingToken)>,
    shard: ShardId,
    reader: (usize, u32),
    token: FencingToken,
) {
    if let Some(&(last, max)) = readers.get(&shard) {
        if last == reader {
            assert!(
                token >= max,
                "shard {shard}: {reader:?} resumed with token {token} below {max}"
            );
        } else {
            assert!(
                token > max,
                "shard {shard}: {reader:?} got token {token}, not above {max} of an earlier reader {last:?}"
            );
        }
    }
    let max = readers.get(&shard).map_or(token, |&(_, max)| max.max(token));
    readers.insert(shard, (reader, max));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn no_split_ownership_and_eventual_assignment(shards in 1u32..7, ops in prop::collection::vec(op(), 1..80)) {
        let mut w = World::new(shards);
        let mut history = Vec::new();
        for op in &ops {
            history.push(op.clone());
            w.step(op, &history);
            w.check_no_split(&history);
        }
        w.settle(&history);
        let alive: Vec<&Client> = w.clients.iter().filter(|c| c.alive()).collect();
        if !alive.is_empty() {
            for s in 0..w.h.meta.shard_count {
                let n = alive.iter().filter(|c| c.reading().contains(&ShardId(s))).count();
                prop_assert_eq!(n, 1, "shard {} read by {} clients after settling; ops {:#?}; meta {:#?}", s, n, history, w.h.meta);
            }
        }
    }
}
