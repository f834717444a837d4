//! What the routing world checks: the properties of every state ([`RoutingWorld::check`]) and, after a fair,
//! fault-free suffix, that nothing stays stranded and every producer can publish ([`RoutingWorld::settle`]).

use super::*;

impl RoutingWorld {
    /// What holds in every state.
    ///
    /// * Property 2 (a version names one layout, for the writes): an entry written with version `v` on shard `s`
    ///   when this history's routing hash had committed `v`: the key maps to `s` under the shard count `v` had.
    ///   (A version the history had not committed named no layout here: the write was made with a routing Redis
    ///   lost, and property 1 and 3 judge it, also when a restore the coordinator cannot see lets a later
    ///   growth issue the number again.)
    /// * Property 3 (per-key order across a growth): for every growth the stored routing records and each of its
    ///   parents sealed at position `p`: (a) every entry of the parent after `p` has a key the growth's layout
    ///   keeps on the parent (no moved key is written into a sealed parent), and (b) every entry of a key in the
    ///   parent up to `p` was written before every entry of that key in the growth's children (groups read the
    ///   parent up to the seal, then the children).
    /// * Every growth the stored routing records has a seal for every parent (sealed before the commit).
    pub fn check(&self) -> Result<(), Violation> {
        let routing = self.stored();
        for (s, side) in self.redis.shards.iter().enumerate() {
            for e in &side.entries {
                if let Some(n) = e.meant {
                    let meant = shard_for_key(self.key(e.key), n).0;
                    if meant != s as u32 {
                        return Err(format!(
                            "an entry of {} written with v{}/{} shards is on shard {s}, but v{} means {n} shards in this history: shard {meant}",
                            key_name(e.key), e.version, e.count, e.version
                        ));
                    }
                }
            }
        }
        for g in &routing.growths {
            if !g.sealed() {
                return Err(format!("committed growth v{} has unsealed parents", g.routing_version));
            }
            for (&parent, &seal) in &g.seals {
                let side = &self.redis.shards[parent.0 as usize];
                for e in side.entries.iter().filter(|e| e.id > seal) {
                    let to = shard_for_key(self.key(e.key), g.shard_count).0;
                    if to != parent.0 {
                        if self.documented(parent.0) {
                            continue;
                        }
                        let kept = match side.seals.get(&g.routing_version.0) {
                            Some(p) => format!("the parent still records seal {}", pos(*p)),
                            None => "the parent no longer records the seal".to_owned(),
                        };
                        return Err(format!(
                            "key {} written by P{} with v{}/{} shards into parent {} at {} after its seal {} for v{} \
                             (the growth moves it to shard {to}; fence now {}, {kept})",
                            key_name(e.key),
                            e.producer,
                            e.version,
                            e.count,
                            parent.0,
                            pos(e.id),
                            pos(seal),
                            g.routing_version,
                            side.fence
                        ));
                    }
                }
                for e in side
                    .entries
                    .iter()
                    .filter(|e| e.id <= seal && !self.documented(parent.0))
                {
                    for c in g.parents..g.shard_count {
                        let child = &self.redis.shards[c as usize];
                        if let Some(later) = child.entries.iter().find(|x| x.key == e.key && x.seq < e.seq) {
                            return Err(format!(
                                "key {}: write #{} (P{} v{}/{}) on child {c} of v{} precedes write #{} (P{} v{}/{}) \
                                 on parent {} up to its seal {}: groups read them in the other order",
                                key_name(e.key),
                                later.seq,
                                later.producer,
                                later.version,
                                later.count,
                                g.routing_version,
                                e.seq,
                                e.producer,
                                e.version,
                                e.count,
                                parent.0,
                                pos(seal)
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether the documented Cluster limit excuses a broken order around `parent` (docs/resharding.md, "Limits":
    /// a failover of a parent's master that loses its seal lets producers of the old layout write moved keys into
    /// it).
    pub(super) fn documented(&self, parent: u32) -> bool {
        self.documented_limits && self.lost_seal & (1 << parent) != 0
    }

    /// The fair, fault-free suffix: the section in progress finishes, then three rounds of a tick and a refresh
    /// of every producer (each with the section it starts). Property 1 after it: every accepted write still in
    /// Redis is on a shard below the stored shard count (some group reads it). With `availability`: every
    /// producer can publish every key.
    pub fn settle(&self, config: &RoutingConfig, log: &mut Vec<String>) -> Result<(), Violation> {
        let mut w = self.clone();
        w.finish(log)?;
        for _ in 0..3 {
            w.logged(Action::Tick, log)?;
            w.finish(log)?;
            for p in 0..w.producers.len() as u8 {
                w.logged(Action::Refresh(p), log)?;
                w.finish(log)?;
            }
        }
        let n = w.stored().shard_count;
        for (s, side) in w.redis.shards.iter().enumerate().skip(n as usize) {
            if let Some(e) = side.entries.first() {
                return Err(format!(
                    "stranded: shard {s} holds {} accepted write(s) (first: {} by P{} with v{}/{} shards) but the \
                     routing settled at {} with record {:?} on shard {s}",
                    side.entries.len(),
                    key_name(e.key),
                    e.producer,
                    e.version,
                    e.count,
                    describe(w.stored()),
                    side.born
                ));
            }
        }
        if config.availability {
            for p in 0..w.producers.len() as u8 {
                for k in 0..config.keys {
                    if let Some((s, Err(why))) = w.route(p, k) {
                        return Err(format!(
                            "unavailable: after the fair suffix P{p} ({:?}) cannot publish {} to shard {s}: {why} \
                             (routing {})",
                            w.producers[p as usize].cache,
                            key_name(k),
                            describe(w.stored())
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn finish(&mut self, log: &mut Vec<String>) -> Result<(), Violation> {
        while let Some(op) = &self.op {
            let a = if op.records.is_some() {
                Action::Records
            } else {
                Action::Commit
            };
            self.logged(a, log)?;
        }
        Ok(())
    }

    pub(super) fn logged(&mut self, a: Action, log: &mut Vec<String>) -> Result<(), Violation> {
        match self.step(a) {
            Ok(line) => {
                log.push(line);
                Ok(())
            }
            Err(v) => {
                log.push(format!("{a:?}: VIOLATION"));
                Err(v)
            }
        }
    }
}
