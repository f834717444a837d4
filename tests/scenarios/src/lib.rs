//! Failure scenarios of redis-stream-coord, run against real `redis-server` processes, the real coordinator and
//! the SDK clients (see `tests/README.md` for the map from each scenario to its tests).
//!
//! # Layout
//! * [`invariants`]: the invariant checker: a [`History`] of every handler invocation and acknowledged publish,
//!   and the rules it must obey (one member per shard at a time and within its lease, nothing acknowledged
//!   lost, per-key order). Used by the end-to-end scenarios here and by the chaos soak.
//! * [`stall_log`]: what the stall tests' worker process (`src/bin/stall_worker.rs`) records per handler.
//! * `tests/common`: the scenario environment (Redis, coordinators on fixed addresses, a group, a wire-level
//!   client, SDK builders that record into a [`History`], write-boundary triggers).
//! * `tests/*.rs`: one file per theme; each test is named after what it proves.
#![warn(missing_docs)]

pub mod invariants;
pub mod stall_log;

pub use invariants::{Handled, Handling, History, Publish, Report, Violation};
