//! The modelled world: Redis (with one replica a failover promotes), the coordinator shell around the real core,
//! the network, and the consumer processes running the real client rules. One [`Action`] is one atomic step;
//! [`World::step`] applies it and checks the properties that concern that step, [`World::check`] the ones that
//! concern a state.

use client_core::lease::{effective_lease, Lease, Millis};
use client_core::membership::{Membership, ShardState};
use protocol::messages::HeartbeatRequest;
use protocol::metadata::{GroupMetadata, GroupTimings, StreamRouting};
use protocol::names::{GroupName, StreamName};
use protocol::{FencingToken, MetadataVersion, ShardId};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::super::{apply, create_group, Clock, Input, Liveness, Outcome, Transition};
use super::config::Config;
use super::parts::{
    describe_answer, describe_request, ids, instance, member, Action, Answer, Budget, Client, InFlight, Redis,
    ShellMemory, Violation, INTERVAL, LEASE, REBALANCE, START_MS, TTL,
};
use super::{injected, Bug};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct World {
    pub now: u64,
    pub redis: Redis,
    /// What a failover would promote (the replica's copy, as of the last `Replicate`).
    pub replica: Option<Redis>,
    pub run_id: u32,
    pub shell: Option<ShellMemory>,
    pub global_grace: u64,
    pub clients: Vec<Client>,
    /// Kept sorted (see [`World::normalize`]): the order in which requests arrive is chosen by the actions.
    pub net: Vec<InFlight>,
    pub budget: Budget,
    /// Per shard, in every history: the last reader (slot, process) and the highest token a reader held.
    pub readers: BTreeMap<ShardId, ((u8, u32), FencingToken)>,
    /// Correction rounds opened so far (the fair suffix may open at most one: see [`World::settle`]).
    pub rounds_opened: u32,
    /// The due index is damaged: a tick cannot read it (see [`Action::DamageDueIndex`]).
    pub due_index_damaged: bool,
}

impl World {
    /// Every member joined and settled on the assignment (`started` processes run; the others are down).
    pub fn new(config: &Config, started: u8) -> World {
        let stream = StreamName::new("s").expect("valid stream");
        let routing = StreamRouting::new(stream.clone(), config.shards, START_MS);
        let timings = GroupTimings {
            member_ttl_ms: TTL,
            heartbeat_interval_ms: INTERVAL,
            rebalance_timeout_ms: REBALANCE,
            assignment_lease_ms: LEASE,
        };
        let meta = create_group(
            stream,
            GroupName::new("g").expect("valid group"),
            &routing,
            timings,
            START_MS,
        );
        let clients = (0..config.members)
            .map(|m| Client {
                member: m,
                membership: (m < started).then(|| Membership::new(member(m), instance(m, 0), MetadataVersion(0))),
                process: 0,
                creeping: false,
                stored_max: MetadataVersion(0),
                lease: Lease::default(),
                outstanding: None,
                answer: None,
                left: false,
            })
            .collect();
        let redis = Redis {
            meta,
            liveness: Liveness::new(),
            written_by_run: 0,
        };
        let mut w = World {
            now: START_MS,
            replica: Some(redis.clone()),
            redis,
            run_id: 0,
            // A coordinator that has already seen the group (a fresh one would add a grace period first).
            shell: Some(ShellMemory {
                highest: MetadataVersion(0),
                grace_until: 0,
            }),
            global_grace: 0,
            clients,
            net: Vec::new(),
            budget: config.budget,
            readers: BTreeMap::new(),
            rounds_opened: 0,
            due_index_damaged: false,
        };
        // Warm up with fault-free rounds until the assignment is settled.
        for _ in 0..12 {
            w.fair_round().expect("the warm-up is fault free");
        }
        w.replica = Some(w.redis.clone());
        w
    }

    /// The actions enabled in this state, in a fixed order.
    pub fn actions(&self, config: &Config) -> Vec<Action> {
        let mut out = Vec::new();
        for (i, c) in self.clients.iter().enumerate() {
            let m = i as u8;
            match &c.membership {
                Some(membership) => {
                    if c.outstanding.is_none() {
                        out.push(Action::RoundTrip(m));
                        if self.net.len() < config.net_capacity {
                            out.push(Action::Send(m));
                        }
                    } else {
                        if c.answer.is_some() {
                            out.push(Action::Receive(m));
                        }
                        // A lost request or answer is a timeout to the client: one action covers both.
                        out.push(Action::Timeout(m));
                    }
                    if !membership.shards_in(ShardState::Draining).is_empty() {
                        out.push(Action::Drain(m));
                    }
                    if self.budget.leaves > 0 && self.net.len() < config.net_capacity {
                        out.push(Action::Leave(m));
                    }
                    if self.budget.crashes > 0 {
                        out.push(Action::Crash(m));
                    }
                    if self.budget.give_backs > 0 && self.net.len() < config.net_capacity {
                        out.push(Action::GiveBack(m));
                    }
                    if self.budget.replacements > 0 {
                        out.push(Action::Replace(m));
                    }
                    if self.budget.creeps > 0 && !c.creeping {
                        out.push(Action::Corrupt(m));
                    }
                }
                None => out.push(Action::Start(m)),
            }
        }
        for i in 0..self.net.len() {
            out.push(Action::Deliver(i));
            if self.budget.dups > 0 {
                out.push(Action::Duplicate(i));
            }
            // Losing the request a client waits for is its timeout; only a late one is lost on its own.
            if !self.net[i].current {
                out.push(Action::LoseRequest(i));
            }
        }
        out.push(Action::Tick);
        out.push(Action::Advance);
        if self.budget.index_damages > 0 && !self.due_index_damaged {
            out.push(Action::DamageDueIndex);
        }
        if self.budget.coord_crashes > 0 {
            out.push(Action::CoordinatorCrash);
        }
        if self.budget.failovers > 0 {
            if self.replica.as_ref() != Some(&self.redis) {
                out.push(Action::Replicate);
            }
            out.push(Action::Failover);
        }
        out
    }

    /// Applies `action`; returns a line for the trace, or the violated property.
    pub fn step(&mut self, action: Action) -> Result<String, Violation> {
        let line = match action {
            Action::Send(m) => {
                let req = self.send(m);
                format!("m{m} sends {}", describe_request(&req))
            }
            Action::RoundTrip(m) => {
                let req = self.send(m);
                let i = self
                    .net
                    .iter()
                    .position(|f| f.req == req && f.current)
                    .expect("just sent");
                let answer = self.deliver(i, false)?;
                let received = self.receive(m)?;
                format!("m{m} round trip: {} -> {answer}; {received}", describe_request(&req))
            }
            Action::Deliver(i) | Action::Duplicate(i) => {
                let dup = matches!(action, Action::Duplicate(_));
                let f = self.net[i].clone();
                let answer = self.deliver(i, dup)?;
                let what = if dup { "a duplicate of " } else { "" };
                let late = if f.current { "" } else { " (late: nobody waits for it)" };
                format!(
                    "coordinator handles {what}{}{late} sent at {} -> {answer}",
                    describe_request(&f.req),
                    f.sent_at
                )
            }
            Action::LoseRequest(i) => {
                let f = self.net.remove(i);
                format!("network loses {}", describe_request(&f.req))
            }
            Action::Receive(m) => self.receive(m)?,
            Action::Timeout(m) => {
                self.give_up(m);
                format!("m{m} times out its request")
            }
            Action::Drain(m) => {
                let membership = self.clients[m as usize].membership.as_mut().expect("running");
                let done = membership.shards_in(ShardState::Draining);
                for &s in &done {
                    membership.reader_stopped(s);
                }
                format!("m{m} readers of {} stop", ids(&done))
            }
            Action::Leave(m) => {
                self.give_up(m);
                let c = &mut self.clients[m as usize];
                let membership = c.membership.as_mut().expect("running");
                membership.set_closing();
                for s in membership.revoke_all() {
                    membership.reader_stopped(s);
                }
                let req = membership.leave_request();
                c.membership = None;
                c.left = true;
                c.lease.revoke();
                self.net.push(InFlight {
                    from: m,
                    current: false,
                    sent_at: self.now,
                    req: req.clone(),
                });
                self.budget.leaves -= 1;
                format!("m{m} closes and sends {}", describe_request(&req))
            }
            Action::GiveBack(m) => {
                self.give_up(m);
                let c = &mut self.clients[m as usize];
                let membership = c.membership.as_mut().expect("running");
                for s in membership.revoke_all() {
                    membership.reader_stopped(s);
                }
                let leave = membership.is_joined().then(|| membership.leave_request());
                membership.lose_all();
                c.lease.revoke();
                self.budget.give_backs -= 1;
                match leave {
                    Some(req) => {
                        // The SDK waits for the leave with a timeout and rejoins whatever happened to it.
                        self.net.push(InFlight {
                            from: m,
                            current: false,
                            sent_at: self.now,
                            req: req.clone(),
                        });
                        format!(
                            "m{m} gives every shard back: sends {} and will rejoin",
                            describe_request(&req)
                        )
                    }
                    None => format!("m{m} gives every shard back (not joined) and will rejoin"),
                }
            }
            Action::Replace(m) => {
                let id = self.clients[m as usize].member;
                let process = self
                    .clients
                    .iter()
                    .filter(|c| c.member == id)
                    .map(|c| c.process + 1)
                    .max()
                    .unwrap_or(0);
                let stored_max = self.clients[m as usize].stored_max;
                self.clients.push(Client {
                    member: id,
                    membership: Some(Membership::new(member(id), instance(id, process), stored_max)),
                    process,
                    creeping: false,
                    stored_max,
                    lease: Lease::default(),
                    outstanding: None,
                    answer: None,
                    left: false,
                });
                self.budget.replacements -= 1;
                format!(
                    "a new process {} starts as m{id} in slot {} while slot {m} keeps running",
                    instance(id, process),
                    self.clients.len() - 1
                )
            }
            Action::Corrupt(m) => {
                self.clients[m as usize].creeping = true;
                self.budget.creeps -= 1;
                format!("slot {m}'s version store is damaged: it reports versions no coordinator issued")
            }
            Action::Start(m) => {
                let c = &mut self.clients[m as usize];
                if c.left {
                    // The SDK: a closed consumer is gone; a new one has a new random instance id.
                    c.process += 1;
                }
                c.left = false;
                let id = c.member;
                c.membership = Some(Membership::new(member(id), instance(id, c.process), c.stored_max));
                c.lease = Lease::default();
                format!("slot {m} starts as {}", instance(id, c.process))
            }
            Action::Crash(m) => {
                self.give_up(m);
                let c = &mut self.clients[m as usize];
                c.membership = None;
                c.lease.revoke();
                c.process += 1;
                self.budget.crashes -= 1;
                format!("slot {m} crashes")
            }
            Action::Tick if self.due_index_damaged && injected(Bug::TickStopsOnDamagedIndex) => {
                "tick: cannot read the due index; skipping this tick".to_owned()
            }
            Action::DamageDueIndex => {
                self.budget.index_damages -= 1;
                self.due_index_damaged = true;
                "the due index is damaged (a key of the wrong type)".to_owned()
            }
            Action::Tick => {
                // `tick.rs`: the safety sweep visits every group whatever the due index says, so a damaged index
                // delays a visit by at most one sweep period; the model's tick is that visit.
                let (t, clock) = self.run(|meta, live, clock| apply(meta, live, Input::Tick { routing: None }, clock));
                self.commit(&t, clock, None)?;
                format!("tick: {:?}", t.events)
            }
            Action::Advance => {
                self.now += INTERVAL;
                let expired = self.expire_leases();
                format!("time {}{expired}", self.now)
            }
            Action::CoordinatorCrash => {
                self.shell = None;
                self.global_grace = 0;
                self.budget.coord_crashes -= 1;
                "coordinator restarts (memory lost)".to_owned()
            }
            Action::Replicate => {
                self.replica = Some(self.redis.clone());
                format!("replica catches up at v{}", self.redis.meta.metadata_version.0)
            }
            Action::Failover => {
                let lost = self.redis.meta.metadata_version;
                self.redis = self.replica.clone().expect("a replica");
                self.run_id += 1;
                // The coordinator's run-id check notices the new Redis: no member expires for one TTL.
                if self.shell.is_some() {
                    self.global_grace = self.now + TTL;
                }
                self.budget.failovers -= 1;
                format!(
                    "failover: Redis goes back from v{} to v{}",
                    lost.0, self.redis.meta.metadata_version.0
                )
            }
        };
        self.normalize();
        self.check()?;
        Ok(line)
    }

    fn send(&mut self, m: u8) -> HeartbeatRequest {
        let c = &mut self.clients[m as usize];
        let mut req = c.membership.as_ref().expect("running").request();
        if c.creeping {
            req.max_observed_version = req.max_observed_version.max(req.metadata_version.next());
        }
        c.outstanding = Some(self.now);
        self.net.push(InFlight {
            from: m,
            current: true,
            sent_at: self.now,
            req: req.clone(),
        });
        req
    }

    /// The client stops waiting: later answers to what it sent are dropped.
    pub(super) fn give_up(&mut self, m: u8) {
        let c = &mut self.clients[m as usize];
        c.outstanding = None;
        c.answer = None;
        for f in self.net.iter_mut().filter(|f| f.from == m) {
            f.current = false;
        }
    }

    /// The coordinator handles request `i` (leaving it in the network when `dup`).
    pub(super) fn deliver(&mut self, i: usize, dup: bool) -> Result<String, Violation> {
        let f = if dup {
            self.budget.dups -= 1;
            self.net[i].clone()
        } else {
            self.net.remove(i)
        };
        let (t, clock) = self.run(|meta, live, clock| apply(meta, live, Input::Heartbeat(&f.req), clock));
        self.commit(&t, clock, Some(&f.req))?;
        let answer = match &t.outcome {
            Outcome::Heartbeat(r) => Answer::Heartbeat(r.clone()),
            Outcome::Rejected(r) => Answer::Rejected(r.status),
            Outcome::Done => return Err(format!("a heartbeat got no answer: {t:?}")),
        };
        let text = describe_answer(&answer);
        if f.current {
            let c = &mut self.clients[f.from as usize];
            if c.outstanding == Some(f.sent_at) && c.answer.is_none() {
                c.answer = Some(answer);
                // Its twin (a duplicate in the network) is answered: nobody waits for the other copy.
                for g in self.net.iter_mut().filter(|g| g.from == f.from) {
                    g.current = false;
                }
            }
        }
        Ok(text)
    }

    /// The shell around the core: the clock it passes (grace, suspected loss), as the coordinator computes it
    /// from what it remembers and what Redis says.
    fn run(&mut self, f: impl FnOnce(&GroupMetadata, &Liveness, Clock) -> Transition) -> (Transition, Clock) {
        let meta = &self.redis.meta;
        let ttl = meta.timings.member_ttl_ms;
        let now = self.now;
        let memory = self.shell.unwrap_or(ShellMemory {
            highest: MetadataVersion(0),
            // First sight of the group by this process: grace.
            grace_until: now + ttl,
        });
        let mut grace = memory.grace_until;
        let mut suspected = None;
        let round_covers = meta
            .correction
            .as_ref()
            .is_some_and(|r| r.reported_max_version >= memory.highest);
        if meta.metadata_version < memory.highest && !round_covers {
            grace = grace.max(now + ttl);
            suspected = Some(memory.highest);
        }
        if self.redis.written_by_run != self.run_id {
            grace = grace.max(now + ttl);
            suspected = Some(suspected.unwrap_or(meta.metadata_version).max(meta.metadata_version));
        }
        self.shell = Some(ShellMemory {
            highest: memory.highest.max(meta.metadata_version),
            grace_until: grace,
        });
        let clock = Clock {
            now_ms: now,
            expiry_allowed_from_ms: grace.max(self.global_grace),
            suspected_loss: suspected,
        };
        (f(meta, &self.redis.liveness, clock), clock)
    }

    /// Writes a transition as the store's compare-and-set would, checking the write-side properties.
    fn commit(&mut self, t: &Transition, clock: Clock, req: Option<&HeartbeatRequest>) -> Result<(), Violation> {
        if matches!(t.outcome, Outcome::Rejected(_)) {
            // A rejected request changes nothing stored, except the evidence of a loss it carries (a version
            // above the stored one) or the shell's suspicion: those open the correction round, whoever sends them.
            let beyond_round = t.next.as_ref().is_some_and(|next| {
                let mut same = next.clone();
                same.correction.clone_from(&self.redis.meta.correction);
                same != self.redis.meta
            });
            if beyond_round || !t.renew.is_empty() || !t.forget.is_empty() {
                return Err(format!(
                    "a rejected request changed what is stored: {:?} (clock {clock:?})\nwrites {:?} renew {:?} forget {:?}",
                    req.map(describe_request),
                    t.next.as_ref().map(|n| n.metadata_version),
                    t.renew,
                    t.forget
                ));
            }
        }
        if let Some(next) = &t.next {
            let meta = &self.redis.meta;
            if next.metadata_version < meta.metadata_version {
                return Err(format!(
                    "metadata version went down within one Redis history: v{} -> v{}",
                    meta.metadata_version.0, next.metadata_version.0
                ));
            }
            for (i, (old, new)) in meta.shards.iter().zip(&next.shards).enumerate() {
                if new.fencing_token < old.fencing_token {
                    return Err(format!(
                        "fencing token of shard {i} went down: {} -> {}",
                        old.fencing_token, new.fencing_token
                    ));
                }
            }
            self.redis.meta = next.clone();
            if let Some(memory) = self.shell.as_mut() {
                memory.highest = memory.highest.max(next.metadata_version);
            }
        }
        for (m, lease) in &t.renew {
            let e = self.redis.liveness.entry(m.clone()).or_insert(0);
            *e = (*e).max(*lease);
        }
        for m in &t.forget {
            self.redis.liveness.remove(m);
        }
        if t.writes() {
            self.redis.written_by_run = self.run_id;
        }
        let opened = t
            .events
            .iter()
            .filter(|e| matches!(e, super::super::Event::CorrectionOpened { .. }))
            .count();
        self.rounds_opened += opened as u32;
        Ok(())
    }

    /// The client applies the answer it waited for, as the SDK's heartbeat loop does.
    pub(super) fn receive(&mut self, m: u8) -> Result<String, Violation> {
        let now = Millis(self.now);
        let c = &mut self.clients[m as usize];
        let answer = c.answer.take().expect("an answer to receive");
        let sent_at = c.outstanding.take().expect("a request it waits for");
        let membership = c.membership.as_mut().expect("running");
        let reader = (m, c.process);
        match &answer {
            Answer::Heartbeat(r) if !r.member_epoch.is_leave() => {
                let lease = effective_lease(
                    Duration::from_millis(r.assignment_lease_ms),
                    Duration::from_millis(LEASE),
                    Duration::ZERO,
                );
                c.lease.grant(Millis(sent_at), lease);
                let actions = membership.apply(r, c.lease.is_valid_at(now));
                c.stored_max = c.stored_max.max(membership.max_observed());
                for &s in &actions.start {
                    if !r.fencing_tokens.iter().any(|t| t.shard == s) {
                        return Err(format!("m{m} started shard {s} without a fencing token: {r:?}"));
                    }
                    check_token(&mut self.readers, s, reader, membership.token(s))?;
                }
                let mut line = format!("m{m} receives {}", describe_answer(&answer));
                if !actions.start.is_empty() || !actions.drain.is_empty() {
                    let _ = write!(line, " (starts {} drains {})", ids(&actions.start), ids(&actions.drain));
                }
                Ok(line)
            }
            Answer::Heartbeat(_) => {
                membership.lose_all();
                c.lease.revoke();
                Ok(format!("m{m} receives a leave answer: rejoins"))
            }
            Answer::Rejected(status) if status.is_replaced() => {
                // The SDK stops for good: another process holds the member id.
                let lost = membership.lose_all();
                c.membership = None;
                c.lease.revoke();
                Ok(format!("m{m} receives {status}: loses {} and stops", ids(&lost)))
            }
            Answer::Rejected(status) if status.requires_rejoin() => {
                let lost = membership.lose_all();
                c.lease.revoke();
                Ok(format!("m{m} receives {status}: loses {} and rejoins", ids(&lost)))
            }
            Answer::Rejected(status) => {
                membership.record_status(*status);
                Ok(format!("m{m} receives {status}"))
            }
        }
    }

    /// The SDK's lease rule: a reader never reads past the lease, and the heartbeat loop puts every shard in
    /// local revoking state when it runs out.
    fn expire_leases(&mut self) -> String {
        let now = Millis(self.now);
        let mut out = String::new();
        for (i, c) in self.clients.iter_mut().enumerate() {
            if let Some(membership) = c.membership.as_mut() {
                if !c.lease.is_valid_at(now) {
                    let stopped = membership.revoke_all();
                    for &s in &stopped {
                        membership.reader_stopped(s);
                    }
                    if !stopped.is_empty() {
                        let _ = write!(out, "; m{i}'s lease ran out, its readers of {} stop", ids(&stopped));
                    }
                }
            }
        }
        out
    }

    /// A canonical order of the network (any arrival order is an action away), so that states differing only
    /// in the order of sends are one state.
    fn normalize(&mut self) {
        self.net.sort_by(|a, b| {
            (a.from, a.sent_at, a.current, a.req.metadata_version, a.req.member_epoch)
                .cmp(&(b.from, b.sent_at, b.current, b.req.metadata_version, b.req.member_epoch))
                .then_with(|| format!("{:?}", a.req).cmp(&format!("{:?}", b.req)))
        });
    }
}

/// A reader that starts a shard needs a token above every token an earlier reader of it held; only the same
/// process resuming the shard (nobody read it in between) may hold the same one again.
fn check_token(
    readers: &mut BTreeMap<ShardId, ((u8, u32), FencingToken)>,
    shard: ShardId,
    reader: (u8, u32),
    token: FencingToken,
) -> Result<(), Violation> {
    if let Some(&(last, max)) = readers.get(&shard) {
        if last == reader && token < max {
            return Err(format!(
                "shard {shard}: {reader:?} resumed with token {token} below {max}"
            ));
        }
        if last != reader && token <= max {
            return Err(format!(
                "shard {shard}: m{} got token {token}, not above {max} of an earlier reader m{}",
                reader.0, last.0
            ));
        }
    }
    let max = readers.get(&shard).map_or(token, |&(_, max)| max.max(token));
    readers.insert(shard, (reader, max));
    Ok(())
}
