//! Failure scenarios of redis-stream-coord, run against real `redis-server` processes, the real coordinator and
//! the SDK clients (see `tests/README.md` for the map from each scenario to its tests).
//!
//! # Layout
//! * [`invariants`]: the history checker (`test_support::history`, re-exported): a [`History`] of every handler
//!   invocation and acknowledged publish, and the rules it must obey (one member per shard at a time and within
//!   its lease, nothing acknowledged lost, per-key order). Used by the end-to-end scenarios here and by the
//!   chaos soak.
//! * [`stall_log`]: what the stall tests' worker process (`src/bin/stall_worker.rs`) records per handler.
//! * `tests/common`: the scenario environment, by concern: `env` (Redis, coordinators on fixed addresses, a
//!   group), `api` (the wire-level client), `wire_member`, `builders` (SDK builders that record into a
//!   [`History`], publishers), `triggers` (write-boundary faults) and `assertions`.
//! * `tests/*.rs`: one file per theme; each test is named after what it proves.
#![warn(missing_docs)]

pub mod stall_log;

/// The history checker, re-exported from `test_support::history`.
pub mod invariants {
    pub use test_support::history::*;
}

pub use invariants::{Handled, Handling, History, Publish, Report, Violation};
