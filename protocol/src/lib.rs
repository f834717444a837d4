//! Wire types, statuses, Redis key layout and shard routing shared by the redis-stream-coord coordinator and its
//! consumer and producer SDKs.
//!
//! Nothing here does I/O: the crate is the contract between the processes, so a change here is a protocol
//! change (the golden fixtures in `testdata/` make every such change fail a test until it is deliberate).
//!
//! # Layout
//! * [`version`]: newtypes for versions, epochs, fencing tokens and shard ids.
//! * [`names`]: validated stream, group and member names (safe inside Redis hash tags).
//! * [`keys`]: the one function per Redis key.
//! * [`routing`]: `shard_for_key`: xxHash64 + jump consistent hash, with shipped test vectors.
//! * [`status`]: the status every response carries.
//! * [`messages`]: HTTP request and response bodies.
//! * [`routes`]: the coordinator's HTTP route templates, and one function per route that builds its path.
//! * [`metadata`]: the documents stored in Redis (group aggregate, stream routing).
//! * [`reshard`]: the growth records: seal positions of parent shards, a group's drained parents.
//! * [`error`]: decode and name errors.
//! * [`redact`]: `redact_url`, the one way every crate prints a URL that may carry a password.
//!
//! # Example
//! ```
//! use protocol::{keys, names::StreamName, routing::shard_for_key};
//!
//! let stream = StreamName::new("orders").unwrap();
//! let shard = shard_for_key(b"customer-42", 8);
//! assert!(shard.0 < 8);
//! let key = keys::shard_stream(&stream, shard);
//! assert!(key.starts_with(&format!("redis-stream:shard:{{orders:{}:", shard.0)));
//! // Its hash slot is chosen, not hashed: the shards of a stream spread evenly over a Redis Cluster.
//! assert_eq!(protocol::slot::key_slot(key.as_bytes()), keys::shard_slot(&stream, shard));
//! ```
#![warn(missing_docs)]

pub mod error;
pub mod keys;
pub mod messages;
pub mod metadata;
pub mod names;
pub mod redact;
pub mod reshard;
pub use reshard::EntryId;
pub mod routes;
pub mod routing;
pub mod slot;
pub mod status;
pub mod version;

pub use error::{DecodeError, NameError};
pub use status::Status;
pub use version::{
    AssignmentEpoch, FencingToken, Incarnation, MemberEpoch, MetadataVersion, RoutingVersion, ShardId, StoreRevision,
};
