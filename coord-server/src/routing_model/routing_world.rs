//! The routing world: a stream's routing hash, its shards (each one hash slot: the shard's record and its
//! stream), producers routing keys by their cached routing, the coordinator's routing decisions, and Redis losing
//! writes. One [`Action`] is one atomic step; [`RoutingWorld::step`] applies it and checks what concerns that step,
//! [`RoutingWorld::check`] what concerns a state, [`RoutingWorld::settle`] what must hold after a fair suffix.
//!
//! The decisions are the real ones: `routing_section::{grow, restore}` (which call `state_machine::routing::plan`
//! and `state_machine::add_shards`) decide from a `Loaded` and a `Probed` built from the modelled Redis, and
//! `state_machine::routing::answer` answers the producers. What the I/O shell does around them is re-stated here,
//! with the file it comes from: the probe and the tick's look (`routing_section::probe`,
//! `Coordinator::tend_routing`), the routing fetch (`Coordinator::routing`), the seal and record scripts
//! (`store::reshard::{SEAL, RECORD}`), the data-plane writes before the commit and the compare-and-set commit
//! (`routing_section::RoutingSection`), the producer's cache (`stream-producer` `routing_cache.rs`) and its
//! fenced publish rule (fence and record, `docs/resharding.md` "A write needs a shard the routing knows").
//!
//! Files: this one holds the world and its actions (the coordinator's side); `modelled_redis.rs` the modelled
//! Redis; `producers.rs` the producers (cache, fetch, publish rule); `properties.rs` what is checked.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::LazyLock;

use protocol::messages::RoutingQuery;
use protocol::metadata::{StreamRouting, MAX_SHARDS};
use protocol::names::StreamName;
use protocol::reshard::{Birth, EntryId};
use protocol::routing::shard_for_key;
use protocol::{RoutingVersion, ShardId, Status};

use crate::routing_section::{self, Probed, RoutingStep};
use crate::state_machine::model::{injected, Bug};
use crate::state_machine::routing::{self, answer, Report, SealTodo, Why};
use crate::stats::Stats;
use crate::store::Loaded;

mod modelled_redis;
mod producer_cache;
mod producers;
mod properties;

pub use modelled_redis::describe;
use modelled_redis::{describe_side, key_name, loaded_of, pos, shards, write_records};
pub use modelled_redis::{Entry, Redis, Replicas, RoutingHash, ShardSide};
pub use producer_cache::Producer;

/// Redis time at the start, in ms: above the first routing versions (1, 2, …), as Redis time is in a deployment.
pub const START_MS: u64 = 1_000;

/// What to explore.
#[derive(Debug, Clone, Copy)]
pub struct RoutingConfig {
    /// Producers (1-2), each with its own routing cache.
    pub producers: u8,
    /// Keys the producers publish (1-2): key `i` moves to a new shard at the `i`-th growth by one shard.
    pub keys: u8,
    /// The stream's shard count at the start.
    pub shards: u32,
    /// An add-shards adds 1 to `max_grow` shards (each count is its own action).
    pub max_grow: u32,
    /// Actions per path, from the start state.
    pub depth: usize,
    /// A Redis Cluster: the routing hash and each shard live on masters of their own, which fail over (and lose
    /// writes) independently. Otherwise one node: a failover loses every write after one point.
    pub cluster: bool,
    /// Cluster only: the shards whose master may fail over (bit `s` for shard `s`).
    pub shard_nodes: u32,
    /// Redis time moves this much at a failover or a restore (a failover takes time; 0: the new master's clock
    /// is where the old one was).
    pub clock_gap: u64,
    pub budget: RoutingBudget,
    /// Of the states reached, follow every n-th (by discovery order) with the fair suffix.
    pub suffix_every: usize,
    /// After the fair suffix, every producer can publish every key (a refused producer is not stuck).
    pub availability: bool,
    /// Redis may fail over (or be restored) while a routing section is between its seals and its commit.
    pub mid_section_loss: bool,
    /// A restore of the snapshot keeps Redis's run id (an operator's `RESTORE` into the running server); otherwise
    /// Redis restarts from the older file (a new run id).
    pub restore_keeps_run_id: bool,
    /// A snapshot taken before a failover may be restored after it (two losses, the second going back before
    /// the first).
    pub restore_across_loss: bool,
    /// Accept the documented Cluster limit (docs/resharding.md): a parent whose master failed over and lost its
    /// seal takes writes of moved keys from producers of the old layout.
    pub documented_limits: bool,
}

/// Budgets of what may still happen on this path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoutingBudget {
    /// Add-shards calls.
    pub growths: u8,
    /// Accepted writes (all producers together).
    pub writes: u8,
    /// One node: failovers. Cluster: failovers of the routing hash's master.
    pub failovers: u8,
    /// Cluster: failovers of a shard's master.
    pub shard_failovers: u8,
    /// Restores of an earlier snapshot of the whole Redis (an operator's `RESTORE`: the run id stays).
    pub restores: u8,
    /// Routing sections that stop between their writes (the coordinator dies, or Redis fails a write).
    pub abandons: u8,
    /// Routing fetches of a hostile client reporting a version and a shard count nobody issued
    /// ([`Action::Forge`]).
    pub forgeries: u8,
}

impl RoutingBudget {
    /// Nothing happens.
    pub const NONE: RoutingBudget = RoutingBudget {
        growths: 0,
        writes: 0,
        failovers: 0,
        shard_failovers: 0,
        restores: 0,
        abandons: 0,
        forgeries: 0,
    };
}

/// Who started the routing section in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    /// Add-shards of this many shards.
    Grow(u32),
    /// The tick's restoration.
    Tick,
    /// A producer's routing fetch, restoring from its report before the answer.
    Fetch(u8, RoutingQuery),
    /// A hostile client's routing fetch (`Action::Forge`).
    Forged,
}

/// A routing section between its writes: the seals were taken when it started; the records and the commit
/// remain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub kind: OpKind,
    /// The routing hash as loaded (the commit's compare-and-set) and the run id the load saw.
    pub loaded: (u64, StreamRouting),
    pub loaded_run: u32,
    pub next: StreamRouting,
    /// Records still to write; `None` once written.
    pub records: Option<Vec<Birth>>,
    pub why: Vec<Why>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingWorld {
    /// Redis time, ms.
    pub now: u64,
    pub redis: Redis,
    pub replicas: Replicas,
    /// A snapshot of the whole Redis an operator may restore, and whether Redis lost writes since it was taken.
    pub backup: Option<Box<Redis>>,
    pub loss_since_backup: bool,
    /// Run id of the node holding the routing hash.
    pub routing_run: u32,
    pub producers: Vec<Producer>,
    pub op: Option<Op>,
    pub budget: RoutingBudget,
    /// Ghost: every routing ever committed, in any history: version -> shard count.
    pub ever: BTreeMap<u64, u32>,
    /// Ghost: the most shards any add-shards decided (committed or not: its records and seals are Redis's evidence).
    pub grown_to: u32,
    /// Ghost: writes accepted so far (the next write's `seq`).
    pub writes: u32,
    /// Redis time moves this much at a failover or a restore (the configuration's `clock_gap`).
    pub clock_gap: u64,
    /// The shard count the stream started with (which keys the producers publish).
    pub initial_shards: u32,
    /// Ghost, Cluster: the shards whose master lost a seal (or fence) in a failover (bit `s` for shard `s`).
    pub lost_seal: u32,
    /// `RoutingConfig::documented_limits`.
    pub documented_limits: bool,
    /// `RoutingConfig::restore_keeps_run_id`.
    pub restore_keeps_run_id: bool,
}

/// One atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Producer `p` fetches the routing, reporting the highest it saw; when that is above the stored routing, a
    /// restoration starts (seals taken) and the producer waits for its commit.
    Refresh(u8),
    /// A hostile (or damaged) client fetches the routing reporting what no coordinator issued: a version above the
    /// stored one and as many shards as the modelled Redis has room for (a forged producer token, or a version
    /// store of another stream). A report is never evidence: this must change nothing.
    Forge,
    /// Producer `p` publishes key `k` with its cached routing (a refused write changes nothing: the producer
    /// refreshes and routes again, which are actions of their own).
    Publish(u8, u8),
    /// Add-shards of `n` shards: load, probe, decide (`routing_section::grow`), seal the parents.
    Grow(u32),
    /// The tick's look at the routing; a restoration starts (seals taken) when it shows a loss.
    Tick,
    /// The section in progress writes the new shards' records.
    Records,
    /// The section in progress commits the routing (compare-and-set on the loaded revision) and answers.
    Commit,
    /// The section in progress stops: nothing more of it is written.
    Abandon,
    /// One node: the replica stops copying here (a failover keeps what was written before).
    Lag,
    /// One node: the replica becomes the primary, with a new run id.
    Failover,
    /// Cluster: the routing master's replica stops copying here.
    LagRouting,
    /// Cluster: the routing master fails over (new run id for the routing hash).
    FailoverRouting,
    /// Cluster: shard `s`'s master's replica stops copying here.
    LagShard(u32),
    /// Cluster: shard `s`'s master fails over: its record and stream go back to the replica's copy.
    FailoverShard(u32),
    /// An operator takes a snapshot of the whole Redis.
    Backup,
    /// An operator restores the snapshot: into the running Redis (the run id stays) or by a restart from the
    /// older file (a new run id), as configured.
    Restore,
}

/// A property violation, with what was seen.
pub type Violation = String;

static STATS: LazyLock<Stats> = LazyLock::new(Stats::default);

fn stream() -> StreamName {
    StreamName::new("s").expect("valid stream")
}

/// The model's keys: key `i` stays on its shard until the stream grows from `shards + i` to `shards + i + 1`
/// shards, and moves then (so each growth by one shard moves one of them).
pub fn keys(shards: u32) -> [Vec<u8>; 2] {
    let mut found: [Option<Vec<u8>>; 2] = [None, None];
    for i in 0..10_000 {
        let k = format!("k{i}").into_bytes();
        let shard = |n: u32| shard_for_key(&k, n).0;
        for (j, slot) in found.iter_mut().enumerate() {
            let n = shards + j as u32;
            let stays = (shards..=n).all(|m| shard(m) == shard(shards));
            if slot.is_none() && stays && shard(n + 1) == n {
                *slot = Some(k.clone());
                break;
            }
        }
        if found.iter().all(Option::is_some) {
            break;
        }
    }
    found.map(|k| k.expect("a key for every growth among the first 10,000 names"))
}

impl RoutingWorld {
    /// The stream created with `config.shards` shards (records written first, as `routing_section::ensure`
    /// does), both producers having fetched it.
    pub fn new(config: &RoutingConfig) -> RoutingWorld {
        let loaded = Loaded {
            revision: None,
            ..loaded_of(None, 0, START_MS)
        };
        let RoutingStep::Prepare(routing, prep) =
            routing_section::ensure(&STATS, &loaded, &stream(), Some(config.shards), 30_000)
                .expect("a new stream's routing")
        else {
            panic!("a new stream is prepared")
        };
        let max_shards = config.shards + u32::from(config.budget.growths) * config.max_grow;
        let mut shards = vec![ShardSide::default(); max_shards as usize];
        write_records(&mut shards, &prep.records);
        let v = routing.routing_version.0;
        let n = routing.shard_count;
        let redis = Redis {
            routing: RoutingHash {
                routing,
                revision: 1,
                written_by: 0,
                lineage: BTreeMap::from([(v, n)]),
            },
            shards,
        };
        RoutingWorld {
            now: START_MS,
            redis,
            replicas: Replicas::default(),
            backup: None,
            loss_since_backup: false,
            routing_run: 0,
            producers: (0..config.producers)
                .map(|_| Producer {
                    cache: Some((v, n, true)),
                    max_version: v,
                    max_count: n,
                    waiting: false,
                })
                .collect(),
            op: None,
            budget: config.budget,
            ever: BTreeMap::from([(v, n)]),
            grown_to: n,
            writes: 0,
            clock_gap: config.clock_gap,
            initial_shards: config.shards,
            lost_seal: 0,
            documented_limits: config.documented_limits,
            restore_keeps_run_id: config.restore_keeps_run_id,
        }
    }

    /// Key `k`'s bytes.
    fn key(&self, k: u8) -> &'static [u8] {
        &KEYS[self.initial_shards as usize - 1][k as usize]
    }

    fn stored(&self) -> &StreamRouting {
        &self.redis.routing.routing
    }

    /// The actions enabled in this state, in a fixed order.
    pub fn actions(&self, config: &RoutingConfig) -> Vec<Action> {
        let mut out = Vec::new();
        for (i, p) in self.producers.iter().enumerate() {
            if p.waiting {
                continue;
            }
            // A fetch that must restore waits for the routing mutex while a section holds it.
            if self.op.is_none() || !self.reports_above(p) {
                out.push(Action::Refresh(i as u8));
            }
            if p.cache.is_some() && self.budget.writes > 0 {
                for k in 0..config.keys {
                    out.push(Action::Publish(i as u8, k));
                }
            }
        }
        if self.op.is_none() && self.budget.forgeries > 0 {
            out.push(Action::Forge);
        }
        match &self.op {
            None => {
                if self.budget.growths > 0 {
                    for n in 1..=config.max_grow {
                        if self.stored().shard_count + n <= self.redis.shards.len() as u32 {
                            out.push(Action::Grow(n));
                        }
                    }
                }
                out.push(Action::Tick);
            }
            Some(op) => {
                out.push(if op.records.is_some() {
                    Action::Records
                } else {
                    Action::Commit
                });
                if self.budget.abandons > 0 {
                    out.push(Action::Abandon);
                }
            }
        }
        let loss = config.mid_section_loss || self.op.is_none();
        if config.cluster {
            if self.budget.failovers > 0 {
                if self.replicas.routing.is_none() {
                    out.push(Action::LagRouting);
                }
                if loss {
                    out.push(Action::FailoverRouting);
                }
            }
            if self.budget.shard_failovers > 0 {
                for s in 0..self.redis.shards.len() as u32 {
                    if config.shard_nodes & (1 << s) == 0 {
                        continue;
                    }
                    if !self.replicas.shards.contains_key(&s) {
                        out.push(Action::LagShard(s));
                    }
                    if loss {
                        out.push(Action::FailoverShard(s));
                    }
                }
            }
        } else if self.budget.failovers > 0 {
            if self.replicas.node.is_none() {
                out.push(Action::Lag);
            }
            if loss {
                out.push(Action::Failover);
            }
        }
        if self.budget.restores > 0 {
            match self.backup {
                None => out.push(Action::Backup),
                Some(_) if loss && (config.restore_across_loss || !self.loss_since_backup) => out.push(Action::Restore),
                Some(_) => {}
            }
        }
        out
    }

    /// Applies `action`; returns a line for the trace, or the violated property.
    pub fn step(&mut self, action: Action) -> Result<String, Violation> {
        let line = match action {
            Action::Refresh(p) => self.refresh(p)?,
            Action::Forge => {
                self.budget.forgeries -= 1;
                self.forge()?
            }
            Action::Publish(p, k) => self.publish(p, k),
            Action::Grow(n) => {
                self.budget.growths -= 1;
                let loaded = self.loaded();
                let probed = self.probe();
                let step = routing_section::grow(
                    &STATS,
                    &loaded,
                    &probed,
                    &stream(),
                    routing_section::GrowRequest {
                        count: n,
                        if_match: None,
                        ceiling: MAX_SHARDS,
                        quota: None,
                    },
                )
                .map_err(|e| format!("add-shards refused: {e}"))?;
                let RoutingStep::Prepare(next, prep) = step else {
                    return Err("add-shards decided to write nothing".into());
                };
                self.grown_to = self.grown_to.max(next.shard_count);
                let sealed = self.start(OpKind::Grow(n), next, prep.seals, prep.records, Vec::new());
                format!("add-shards +{n}: {sealed}")
            }
            Action::Tick => self.tick()?,
            Action::Records => {
                let op = self.op.as_mut().expect("a section in progress");
                let records = op.records.take().expect("records to write");
                let written = write_records(&mut self.redis.shards, &records);
                format!("section writes records {written}")
            }
            Action::Commit => self.commit()?,
            Action::Abandon => {
                self.budget.abandons -= 1;
                let op = self.op.take().expect("a section in progress");
                if let OpKind::Fetch(p, _) = op.kind {
                    self.producers[p as usize].waiting = false;
                }
                format!("the section of {:?} stops before its commit", op.kind)
            }
            Action::Lag => {
                self.replicas.node = Some(Box::new(self.redis.clone()));
                "the replica stops copying here".to_owned()
            }
            Action::Failover => {
                self.budget.failovers -= 1;
                let before = describe(self.stored());
                if let Some(r) = self.replicas.node.take() {
                    self.redis = *r;
                }
                self.routing_lost();
                format!("failover: Redis goes back from {before} to {}", self.describe_redis())
            }
            Action::LagRouting => {
                self.replicas.routing = Some(self.redis.routing.clone());
                "the routing master's replica stops copying here".to_owned()
            }
            Action::FailoverRouting => {
                self.budget.failovers -= 1;
                let before = describe(self.stored());
                if let Some(r) = self.replicas.routing.take() {
                    self.redis.routing = r;
                }
                self.routing_lost();
                format!("routing master fails over: {before} -> {}", describe(self.stored()))
            }
            Action::LagShard(s) => {
                self.replicas.shards.insert(s, self.redis.shards[s as usize].clone());
                format!("shard {s}'s replica stops copying here")
            }
            Action::FailoverShard(s) => {
                self.budget.shard_failovers -= 1;
                self.loss_since_backup = true;
                if let Some(side) = self.replicas.shards.remove(&s) {
                    let before = &self.redis.shards[s as usize];
                    if side.fence < before.fence || before.seals.keys().any(|v| !side.seals.contains_key(v)) {
                        self.lost_seal |= 1 << s;
                    }
                    self.redis.shards[s as usize] = side;
                }
                self.now += self.clock_gap;
                format!(
                    "shard {s}'s master fails over: it holds {}",
                    describe_side(s, &self.redis.shards[s as usize])
                )
            }
            Action::Backup => {
                self.backup = Some(Box::new(self.redis.clone()));
                format!("an operator takes a snapshot of Redis at {}", self.describe_redis())
            }
            Action::Restore => {
                self.budget.restores -= 1;
                let before = describe(self.stored());
                let lost: Vec<u64> = self.redis.routing.lineage.keys().copied().collect();
                self.redis = *self.backup.take().expect("a snapshot");
                self.loss_since_backup = false;
                self.replicas = Replicas::default();
                let how = if self.restore_keeps_run_id {
                    self.now += self.clock_gap;
                    // Nothing tells the coordinator that numbers were lost, so property 2 (at the commit) cannot
                    // hold for them: the next growth issues them again, with another count. The writes are
                    // judged instead (`check`, the stranded and order properties): the records' counts refuse a
                    // producer that still routes by the lost layout.
                    for v in lost {
                        if !self.redis.routing.lineage.contains_key(&v) {
                            self.ever.remove(&v);
                        }
                    }
                    "into the running Redis (same run id)"
                } else {
                    self.routing_lost();
                    "by a restart (new run id)"
                };
                format!(
                    "an operator restores the snapshot {how}: {before} -> {}",
                    self.describe_redis()
                )
            }
        };
        self.check()?;
        Ok(line)
    }

    /// The routing hash went back (or its node changed): a new history.
    fn routing_lost(&mut self) {
        self.loss_since_backup = true;
        self.routing_run += 1;
        self.now += self.clock_gap;
        self.replicas.routing = None;
    }

    /// `routing_section`'s `Loaded` for the routing hash as it is now.
    fn loaded(&self) -> Loaded {
        loaded_of(Some(&self.redis.routing), self.routing_run, self.now)
    }

    /// `routing_section::probe`: shard 0's fence and the records from the stored count on until one is missing,
    /// then, when shard 0's `fenceCount` is above the missing one, the walk back over the last record of each
    /// growth up to that count.
    fn probe(&self) -> Probed {
        let n = self.stored().shard_count;
        let total = self.redis.shards.len() as u32;
        let birth = |s: u32| {
            let side = &self.redis.shards[s as usize];
            side.born.map(|(born, parents)| Birth {
                shard: ShardId(s),
                born: RoutingVersion(born),
                parents,
                count: side.born_count,
            })
        };
        let mut beyond: Vec<Birth> = (n..total).map_while(birth).collect();
        let gap = n + beyond.len() as u32;
        if gap < total {
            let mut past = Vec::new();
            let mut next = routing::first_past_gap(gap, self.redis.shards[0].fence_count);
            while let Some(s) = next.filter(|&s| s < total) {
                let found = birth(s);
                next = found.and_then(|b| routing::next_past_gap(gap, &b));
                past.extend(found);
            }
            beyond.extend(past.into_iter().rev());
        }
        // `routing_section::entries_end`: the run of shard keys from the stored count on that hold entries.
        let entries_end = n
            + (n..total)
                .take_while(|&s| !self.redis.shards[s as usize].entries.is_empty())
                .count() as u32;
        Probed {
            beyond,
            fence: RoutingVersion(self.redis.shards[0].fence),
            entries_end,
        }
    }

    /// Starts a section: the seals (`SEAL`, in `before_write`), the records and the commit still to come.
    fn start(
        &mut self,
        kind: OpKind,
        mut next: StreamRouting,
        seals: Vec<SealTodo>,
        records: Vec<Birth>,
        why: Vec<Why>,
    ) -> String {
        let mut text = Vec::new();
        for todo in &seals {
            let side = &mut self.redis.shards[todo.shard.0 as usize];
            let v = todo.version.0;
            if side.fence < v {
                side.fence = v;
                side.fence_count = todo.count;
            }
            let reused = todo.reuse.and_then(|r| side.seals.get(&r.0).copied());
            let position = side.seals.get(&v).copied().or(reused).unwrap_or_else(|| side.last_id());
            side.seals.insert(v, position);
            if let Some(g) = next.growths.iter_mut().find(|g| g.routing_version == todo.version) {
                if todo.shard.0 < g.parents {
                    g.seals.entry(todo.shard).or_insert(position);
                }
            }
            text.push(format!("{}@{}{}", todo.shard.0, v, pos(position)));
        }
        let line = format!("{why:?} -> {} after seals [{}]", describe(&next), text.join(" "));
        self.op = Some(Op {
            kind,
            loaded: (self.redis.routing.revision, self.stored().clone()),
            loaded_run: self.routing_run,
            next,
            records: (!records.is_empty()).then_some(records),
            why,
        });
        line
    }

    /// `Coordinator::tend_routing`: two reads; a restoration only when they show a loss, else the sweep that
    /// writes again the records of listed shards Redis lost (`sweep_records`; the model sweeps every shard at
    /// once, the shell 64 per tick).
    fn tick(&mut self) -> Result<String, Violation> {
        let r = self.stored().clone();
        let n = r.shard_count;
        let fence = self.redis.shards[0].fence;
        let beyond = self.redis.shards.get(n as usize).is_some_and(|s| s.born.is_some());
        if !(fence > r.routing_version.0 || beyond || !r.shard_records) {
            let lost: Vec<Birth> = routing_section::migration_records(&r)
                .into_iter()
                .filter(|b| self.redis.shards[b.shard.0 as usize].born.is_none())
                .collect();
            // `store::reshard::RECOUNT`: a record naming more shards than the routing at or below its version.
            let (v, mut recounted) = (r.routing_version.0, Vec::new());
            let recount = !injected(Bug::SweepWithoutRecount);
            for (s, side) in self.redis.shards.iter_mut().enumerate().take(n as usize) {
                if !recount {
                    break;
                }
                let mut changed = false;
                if side.fence_count > n && side.fence <= v {
                    side.fence_count = n;
                    changed = true;
                }
                if side.born_count > n && side.born.is_some_and(|(born, _)| born <= v) {
                    side.born_count = n;
                    changed = true;
                }
                if changed {
                    recounted.push(s.to_string());
                }
            }
            // The fences the sweep read: one above the routing (shard 0's master lost that seal too) restores.
            let seen = self.redis.shards[..n as usize]
                .iter()
                .map(|s| s.fence)
                .max()
                .unwrap_or(0);
            let swept = if lost.is_empty() && recounted.is_empty() {
                "tick: nothing lost".to_owned()
            } else {
                format!(
                    "tick: records written again {}, counts lowered to {n} on [{}]",
                    write_records(&mut self.redis.shards, &lost),
                    recounted.join(" ")
                )
            };
            if seen <= v || injected(Bug::SweepIgnoresFences) {
                return Ok(swept);
            }
            return match self.restore_above(None, RoutingVersion(seen))? {
                None => Ok(format!("{swept}; restores nothing")),
                Some((next, seals, records, why)) => {
                    let line = self.start(OpKind::Tick, next, seals, records, why);
                    Ok(format!("{swept}; fence v{seen} swept: restores {line}"))
                }
            };
        }
        match self.restore(None)? {
            None => Ok("tick: restores nothing".to_owned()),
            Some((next, seals, records, why)) => {
                let line = self.start(OpKind::Tick, next, seals, records, why);
                Ok(format!("tick restores: {line}"))
            }
        }
    }

    /// `routing_section::restore` on the routing as loaded and probed now.
    #[allow(clippy::type_complexity)]
    fn restore(
        &self,
        report: Option<Report>,
    ) -> Result<Option<(StreamRouting, Vec<SealTodo>, Vec<Birth>, Vec<Why>)>, Violation> {
        self.restore_above(report, RoutingVersion(0))
    }

    /// As `restore`, with a fence the sweep saw (`Coordinator::restore_routing_above`).
    #[allow(clippy::type_complexity)]
    fn restore_above(
        &self,
        report: Option<Report>,
        fence_seen: RoutingVersion,
    ) -> Result<Option<(StreamRouting, Vec<SealTodo>, Vec<Birth>, Vec<Why>)>, Violation> {
        let mut probed = self.probe();
        probed.fence = probed.fence.max(fence_seen);
        let (step, why) = routing_section::restore(&STATS, &self.loaded(), &probed, report, MAX_SHARDS)
            .map_err(|e| format!("restore refused: {e}"))?;
        Ok(match step {
            RoutingStep::Keep(_) => None,
            RoutingStep::Prepare(next, prep) => Some((next, prep.seals, prep.records, why)),
            RoutingStep::Write(_) => return Err("a restoration wrote without its seals".into()),
        })
    }

    /// The commit of the section in progress: the compare-and-set on the loaded revision, then the routing.
    fn commit(&mut self) -> Result<String, Violation> {
        let op = self.op.take().expect("a section in progress");
        let hash = &self.redis.routing;
        // `store::COMMIT` refuses a decision loaded from another server (run id) as it refuses another revision.
        if (hash.revision, &hash.routing) != (op.loaded.0, &op.loaded.1) || op.loaded_run != self.routing_run {
            // The section would load again and decide anew: that is another action of its caller.
            if let OpKind::Fetch(p, _) = op.kind {
                self.producers[p as usize].waiting = false;
            }
            return Ok(format!(
                "commit of {:?} conflicts: the routing hash or its server changed since its load (now {})",
                op.kind,
                describe(&hash.routing)
            ));
        }
        let next = op.next;
        let (v, n) = (next.routing_version.0, next.shard_count);
        // Property 4: versions never go down within a history (the compare-and-set makes this the stored one).
        if next.routing_version < hash.routing.routing_version {
            return Err(format!(
                "the routing version went down within one history: {} -> {}",
                describe(&hash.routing),
                describe(&next)
            ));
        }
        // Property 2: a version names one layout, in every history.
        if let Some(&other) = self.ever.get(&v) {
            if other != n {
                return Err(format!(
                    "version {v} names two layouts: {} in an earlier history, {} now",
                    shards(other),
                    shards(n)
                ));
            }
        }
        // Property 7: a restoration grows a stream only to a layout some add-shards decided (in any history, committed
        // or not): what Redis can hold evidence of. A count beyond every one came from a client's word.
        let most = self.ever.values().copied().max().unwrap_or(0).max(self.grown_to);
        if !matches!(op.kind, OpKind::Grow(_)) && n > most && n > hash.routing.shard_count {
            return Err(format!(
                "a restoration ({:?}, {:?}) grew the stream to {} shards, more than any add-shards ever decided \
                 ({most}): a client's report was believed",
                op.kind, op.why, n
            ));
        }
        self.ever.insert(v, n);
        let hash = &mut self.redis.routing;
        hash.lineage.insert(v, n);
        hash.routing = next.clone();
        hash.revision += 1;
        hash.written_by = op.loaded_run;
        let mut line = format!("commit {}", describe(&next));
        if let OpKind::Fetch(p, query) = op.kind {
            self.producers[p as usize].waiting = false;
            let adopted = self.adopt(p, &next, &query);
            let _ = write!(line, "; P{p} gets {adopted}");
        }
        Ok(line)
    }

    pub fn describe_redis(&self) -> String {
        let sides: Vec<String> = self
            .redis
            .shards
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != ShardSide::default())
            .map(|(i, s)| describe_side(i as u32, s))
            .collect();
        format!("{}; {}", describe(self.stored()), sides.join("; "))
    }
}

/// The keys for streams starting with 1 to 4 shards.
static KEYS: LazyLock<Vec<[Vec<u8>; 2]>> = LazyLock::new(|| (1..=4).map(keys).collect());
