//! What the explorer explores: sizes, depth and the fault budget, from the CI defaults or the environment.

use super::parts::Budget;

/// What to explore.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub members: u8,
    pub shards: u32,
    /// Actions per path, from the start state.
    pub depth: usize,
    /// Requests at most in the network at once.
    pub net_capacity: usize,
    pub budget: Budget,
    /// Follow the states at the depth bound with a fair suffix (liveness).
    pub liveness: bool,
    /// Of the states at the depth bound, follow every n-th (by discovery order) with the fair suffix.
    pub liveness_every: usize,
}

impl Config {
    /// The bounded configuration the test suite runs: every kind of fault, once each.
    pub fn ci() -> Config {
        Config {
            members: 2,
            shards: 2,
            depth: 5,
            net_capacity: 2,
            budget: Budget {
                crashes: 1,
                coord_crashes: 1,
                failovers: 1,
                dups: 1,
                leaves: 1,
                ..Budget::NONE
            },
            liveness: true,
            liveness_every: 1,
        }
    }

    /// The second bounded configuration the test suite runs: only the network misbehaves (loss, delay,
    /// reordering, one duplicate) and time moves, which allows a deeper search.
    pub fn ci_network() -> Config {
        Config {
            depth: 8,
            liveness_every: 4,
            budget: Budget {
                dups: 1,
                ..Budget::NONE
            },
            ..Config::ci()
        }
    }

    /// The third bounded configuration the test suite runs: the actors where a name and a process part ways. A
    /// process gives its shards back and rejoins under its own name, a second process starts under a running
    /// one's name, a version store reports versions no coordinator issued; with a failover (a correction round)
    /// and a duplicate.
    pub fn ci_identity() -> Config {
        Config {
            members: 2,
            shards: 2,
            depth: 6,
            budget: Budget {
                failovers: 1,
                dups: 1,
                give_backs: 1,
                replacements: 1,
                creeps: 1,
                ..Budget::NONE
            },
            liveness_every: 4,
            ..Config::ci()
        }
    }

    /// The CI configuration, overridden by the environment (`MODEL_CHECK_DEPTH`, `MODEL_CHECK_MEMBERS`,
    /// `MODEL_CHECK_SHARDS`, `MODEL_CHECK_FAULTS`: the budget of each fault kind).
    pub fn from_env(base: Config) -> Config {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
        let mut c = base;
        if let Some(n) = var("MODEL_CHECK_LIVENESS_EVERY") {
            c.liveness_every = n.max(1) as usize;
        }
        if let Some(n) = var("MODEL_CHECK_NET") {
            c.net_capacity = n.clamp(1, 4) as usize;
        }
        if let Some(d) = var("MODEL_CHECK_DEPTH") {
            c.depth = d as usize;
        }
        if let Some(m) = var("MODEL_CHECK_MEMBERS") {
            c.members = m.clamp(1, 4) as u8;
        }
        if let Some(s) = var("MODEL_CHECK_SHARDS") {
            c.shards = s.clamp(1, 8);
        }
        // `MODEL_CHECK_BUDGET=replacements=1,failovers=1`: exactly these faults, none of the others.
        if let Ok(spec) = std::env::var("MODEL_CHECK_BUDGET") {
            let mut b = Budget::NONE;
            for part in spec.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = part.split_once('=').unwrap_or((part, "1"));
                let n: u8 = v.parse().unwrap_or(1).min(3);
                match k.trim() {
                    "crashes" => b.crashes = n,
                    "coord_crashes" => b.coord_crashes = n,
                    "failovers" => b.failovers = n,
                    "dups" => b.dups = n,
                    "leaves" => b.leaves = n,
                    "give_backs" => b.give_backs = n,
                    "replacements" => b.replacements = n,
                    "creeps" => b.creeps = n,
                    "index_damages" => b.index_damages = n,
                    other => panic!("MODEL_CHECK_BUDGET: unknown fault kind {other:?}"),
                }
            }
            c.budget = b;
        }
        if let Some(f) = var("MODEL_CHECK_FAULTS") {
            let f = f.min(3) as u8;
            c.budget = Budget {
                crashes: f,
                coord_crashes: f,
                failovers: f,
                dups: f,
                leaves: f,
                give_backs: f,
                replacements: f,
                creeps: f,
                index_damages: f.min(1),
            };
        }
        c
    }
}
