//! The redis-stream-coord coordinator: a Redis-recorded state machine that assigns the shards of a sharded Redis
//! Stream to the members of consumer groups, and serves producers their routing.
//!
//! # Layout
//! * [`state_machine`]: the pure core: `(metadata, liveness, input, now) -> (next metadata, answer)`.
//! * [`store`]: the Redis hash per group, the revision compare-and-set and mutex scripts, Redis `TIME`.
//! * [`store::reshard`]: the seal script of a parent shard and the drain observation of a group.
//! * [`coordinator`]: the public operations, wired from the parts below.
//! * `section`: the critical section, written once (shutdown gate, mutex, load, decide, write, answer);
//!   `group_section` and `routing_section`: its kinds; `group_slots`: per-group local lock, queue and memory;
//!   `missing_metadata`: the "never created" or "lost" answer.
//! * [`http`]: the HTTP/JSON API (`/v1`), its router and the mapping of errors to HTTP answers.
//! * [`server`]: [`server::serve`] and [`server::CoordinatorHandle`]: server, tick loop and their shutdown;
//!   `server::tls`: HTTPS on the API listener, with certificate reload.
//! * [`tick`]: the loop that ticks the groups that are due; [`due`]: the due index in Redis and the safety
//!   sweep that bounds what a lost index can delay.
//! * [`shutdown`]: the terminating gate; [`deadline`]: request and mutex-wait deadlines that forgive a stop of this
//!   process (SIGSTOP, a paused VM) once.
//! * [`startup`]: Redis version and command checks; [`memory_policy`]: the `maxmemory-policy` precondition.
//! * [`traces`]: "never created" or "lost" for a group or stream without metadata.
//! * [`log_limit`]: rate limiting of repeated log lines; [`recent`]: the last rebalance events, for the status page.
//! * [`metrics`]: the Prometheus metrics of one coordinator (`GET /metrics`), per instance, no global recorder.
//! * `clock`: where the shells read time (Tokio's clock, so tests pause it).
//! * [`spans`]: the tracing span of every critical section and the write boundary it reached.
//! * [`auth`]: bearer tokens, roles and the stream prefixes they reach; [`quota`]: each token's quotas (groups,
//!   shards and members per group, request rate).
//! * [`config`], [`error`], [`stats`].
//! * `fault` (feature `fault-injection`, tests only): hooks at the write boundary of a critical section.
//! * `routing_model` (tests only): the exhaustive model check of a stream's routing through Redis losses, over
//!   `routing_section` and a modelled Redis (the group model check is `state_machine`'s).
#![warn(missing_docs)]

pub mod auth;
mod clock;
pub mod config;
pub mod coordinator;
pub mod deadline;
pub mod due;
pub mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
mod group_section;
mod group_slots;
pub mod http;
pub mod log_limit;
pub mod memory_policy;
pub mod metrics;
mod missing_metadata;
pub mod quota;
pub mod recent;
#[cfg(test)]
mod routing_model;
mod routing_section;
mod section;
pub mod server;
pub mod shutdown;
pub mod spans;
pub mod startup;
pub mod state_machine;
pub mod stats;
pub mod store;

pub mod tenants;
pub mod tick;

pub use store::traces;

pub use config::{Config, ServerTls};
pub use coordinator::Coordinator;
pub use error::{Error, StoreError};
