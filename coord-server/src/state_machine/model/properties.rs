//! The properties the explorer checks: safety after every step ([`World::check`]) and liveness at the depth bound
//! ([`World::settle`]: a fair, fault-free suffix must settle the assignment).

use client_core::lease::Millis;
use client_core::membership::ShardState;
use protocol::names::MemberId;
use protocol::ShardId;
use std::collections::BTreeMap;

use super::parts::{member, Action, Client, Violation};
use super::world::World;

impl World {
    /// Safety: no shard is held by two members whose leases are valid (a draining reader still holds it).
    pub fn check(&self) -> Result<(), Violation> {
        let now = Millis(self.now);
        let mut holders: BTreeMap<ShardId, Vec<u8>> = BTreeMap::new();
        for (i, c) in self.clients.iter().enumerate() {
            let Some(membership) = &c.membership else { continue };
            if !c.lease.is_valid_at(now) {
                continue;
            }
            for state in [ShardState::Reading, ShardState::Draining] {
                for s in membership.shards_in(state) {
                    holders.entry(s).or_default().push(i as u8);
                }
            }
        }
        for (s, who) in holders {
            if who.len() > 1 {
                return Err(format!(
                    "shard {s} held under valid leases by {:?} at time {}",
                    who.iter()
                        .map(|&i| {
                            let c = &self.clients[i as usize];
                            let name = format!("{}", member(c.member));
                            if self.clients.iter().filter(|o| o.member == c.member).count() > 1 {
                                MemberId::new(format!("{name}-slot{i}")).expect("valid")
                            } else {
                                member(c.member)
                            }
                        })
                        .collect::<Vec<_>>(),
                    self.now
                ));
            }
        }
        Ok(())
    }

    /// One fault-free round: time moves, every running client finishes its draining, and heartbeats once with a
    /// round trip; then the tick.
    pub(super) fn fair_round(&mut self) -> Result<(), Violation> {
        self.step(Action::Advance)?;
        for m in 0..self.clients.len() as u8 {
            if self.clients[m as usize].membership.is_none() {
                continue;
            }
            self.give_up(m);
            let draining = self.clients[m as usize]
                .membership
                .as_ref()
                .is_some_and(|ms| !ms.shards_in(ShardState::Draining).is_empty());
            if draining {
                self.step(Action::Drain(m))?;
            }
            self.step(Action::RoundTrip(m))?;
        }
        self.step(Action::Tick)?;
        Ok(())
    }

    /// Liveness under fairness: from this state, with no more faults (every late request arrives, then every
    /// running client heartbeats each interval and drains at once), every shard ends up read by exactly one
    /// running client under a valid lease, and stays so.
    pub fn settle(&self) -> Result<(), Violation> {
        let mut w = self.clone();
        let rounds_before = w.rounds_opened;
        while !w.net.is_empty() {
            w.deliver(0, false)?;
            w.check()?;
        }
        for m in 0..w.clients.len() as u8 {
            if w.clients[m as usize].answer.is_some() {
                w.receive(m)?;
            }
        }
        // Four member TTLs and rebalance timeouts: expiry, fencing and a correction round all end within them.
        const ROUNDS: usize = 12;
        const STABLE: usize = 3;
        let mut last = None;
        for round in 0..ROUNDS + STABLE {
            w.fair_round()?;
            // No fault happens in the suffix: the only evidence of a loss it can bring is what happened before it
            // (one round corrects that) or a version no coordinator issued, which must not hold the group.
            if w.rounds_opened > rounds_before + 1 {
                return Err(format!(
                    "liveness: {} correction rounds opened in the fault-free suffix (at most one may)",
                    w.rounds_opened - rounds_before
                ));
            }
            if round < ROUNDS {
                continue;
            }
            let running: Vec<&Client> = w.clients.iter().filter(|c| c.membership.is_some()).collect();
            if running.is_empty() {
                return Ok(());
            }
            let mut readers: Vec<Vec<u8>> = Vec::new();
            for s in 0..w.redis.meta.shard_count {
                let who: Vec<u8> = w
                    .clients
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| {
                        c.lease.is_valid_at(Millis(w.now))
                            && c.membership
                                .as_ref()
                                .is_some_and(|ms| ms.state(ShardId(s)) == Some(ShardState::Reading))
                    })
                    .map(|(i, _)| i as u8)
                    .collect();
                if who.len() != 1 {
                    return Err(format!(
                        "liveness: after {ROUNDS} fair rounds shard {s} is read by {who:?} (running: {:?})\nmetadata {:#?}",
                        w.clients
                            .iter()
                            .enumerate()
                            .filter(|(_, c)| c.membership.is_some())
                            .map(|(i, _)| i)
                            .collect::<Vec<_>>(),
                        w.redis.meta
                    ));
                }
                readers.push(who);
            }
            if last.as_ref().is_some_and(|l| l != &readers) {
                return Err(format!(
                    "liveness: the assignment still moves after {ROUNDS} fair rounds"
                ));
            }
            last = Some(readers);
        }
        Ok(())
    }
}
