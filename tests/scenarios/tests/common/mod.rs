//! The scenario environment, shared by every scenario file (`mod common;`), one module per concern:
//! * [`acl`]: the shipped ACL file on test servers, its users' URLs and `ACL LOG`;
//! * [`env`]: [`Scenario`]: a real `redis-server`, one or more in-process coordinators on fixed addresses (so one
//!   can be crashed and brought back on the same URL), and one group with short timings;
//! * [`api`] and [`wire_member`]: level-2 scenarios craft the HTTP requests themselves ([`GroupApi`],
//!   [`WireMember`]);
//! * [`triggers`]: a write-boundary fault ([`coord_server::fault`]) that fires once, on a predicate over the
//!   transition, and tells the test it fired ([`Trigger`]);
//! * [`builders`]: consumer and producer builders whose handlers and publishes record into a [`History`]
//!   (level 3);
//! * [`assertions`]: checks over the stored group and what members read;
//! * [`processes`]: signals to processes and the records of the worker processes (`src/bin/stall_worker.rs`);
//!   [`coord_process`]: coordinators in processes of their own ([`CoordProcess`]), which can hold a section at its
//!   write boundary while the test stops or terminates them.
#![allow(dead_code)] // each scenario file uses a different subset
#![allow(unused_imports)] // the shared imports below serve the submodules; each file uses a different subset

pub mod acl;
pub mod api;
pub mod assertions;
pub mod builders;
pub mod coord_process;
pub mod env;
pub mod processes;
pub mod triggers;
pub mod wire_member;

pub use acl::*;
pub use api::*;
pub use assertions::*;
pub use builders::*;
pub use coord_process::*;
pub use env::*;
pub use processes::*;
pub use triggers::*;
pub use wire_member::*;

use coord_server::fault::{self, Action, FaultGuard, Point, Site};
use coord_server::server::CoordinatorHandle;
use coord_server::state_machine::{Event, Transition};
use coord_server::Config;
use protocol::keys;
use protocol::messages::{
    CreateGroupRequest, ErrorResponse, GroupDescription, HeartbeatRequest, HeartbeatResponse, RecreateGroupRequest,
    RevokeState, RevokingShard,
};
use protocol::metadata::GroupTimings;
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{Incarnation, MemberEpoch, MetadataVersion, ShardId, Status};
use reqwest::StatusCode;
use scenario_tests::History;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use stream_consumer::{ConsumerBuilder, ConsumerHandle, ConsumerStatus, Message};
use stream_producer::{Producer, ProducerBuilder, PublishError, Published};
use test_support::{wait_for, RedisServer};
use tokio::sync::watch;
