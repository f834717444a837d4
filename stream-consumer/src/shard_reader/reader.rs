//! The state of one shard's reader and what its readers share: the types the reader's parts (its read loop in
//! the parent module, its dedicated connection in `dedicated.rs`) all work on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::ExponentialBackoff;
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{FencingToken, ShardId};
use redis::RedisError;
use redis_link::{Connection, KeyRoute, Nodes, PipelinedConnection, Route};
use tokio_util::sync::CancellationToken;

use super::ack_batch::AckBatch;
use super::commands::ShardCommands;
use super::health::ReadHealth;
use crate::config::StartPosition;
use crate::handler::{DynHandler, DynListener};
use crate::in_flight::{InFlight, InFlightGuard};
use crate::lease::LeaseView;
use crate::metrics::ConsumerMetrics;
use crate::stream_reply;

/// Everything the readers of one consumer share.
pub(crate) struct ReaderShared {
    pub stream: StreamName,
    pub group: GroupName,
    pub member_id: MemberId,
    /// Where the dedicated blocking connections go (see [`crate::redis_nodes`]).
    pub redis: Nodes,
    /// For every non-blocking command.
    pub conn: Connection,
    pub handler: Arc<dyn DynHandler>,
    pub listener: Arc<dyn DynListener>,
    /// Checked before every read and every entry.
    pub lease: Arc<LeaseView>,
    pub start_from: StartPosition,
    pub read_block: Duration,
    pub batch_size: usize,
    pub max_deliveries: u32,
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// How often the reader claims the group's pending entries again while it reads: a read sent by a previous
    /// owner's reader before it was killed can reach Redis late (delayed by the network) and hand new entries to
    /// that dead member; `>` never returns them, so only a claim does. One member TTL bounds how long they wait.
    pub reclaim_every: Duration,
    /// Shared with the heartbeat loop; one set of series per consumer.
    pub metrics: ConsumerMetrics,
    /// Longest run of a rebalance callback.
    pub listener_timeout: Duration,
}

impl ReaderShared {
    /// Response timeout of a dedicated connection: longer than `BLOCK`, so a blocking read that returns empty is
    /// never mistaken for a dead connection.
    pub(super) fn blocking_response_timeout(&self) -> Duration {
        self.read_block + self.read_block.max(Duration::from_secs(1))
    }
}

/// A reader's own connection for `XREADGROUP BLOCK`: a pipelining connection whose small RESP parser reads the
/// entry batches (the reply that carries every record) at about half the client CPU of redis-rs's.
pub(super) struct Dedicated {
    pub(super) conn: PipelinedConnection,
    /// The node it is connected to.
    pub(super) route: Route,
}

/// One shard's reader: its assignment, its connection and what it has in hand.
pub(super) struct Reader {
    pub(super) shared: Arc<ReaderShared>,
    /// The stream name every message of this reader shares.
    pub(super) stream: Arc<StreamName>,
    pub(super) shard: ShardId,
    /// The token of this assignment, carried by every message.
    pub(super) fencing_token: FencingToken,
    /// The keys and names of this shard's commands.
    pub(super) cmds: ShardCommands,
    pub(super) stop: CancellationToken,
    pub(super) in_flight: Arc<InFlight>,
    pub(super) health: Arc<ReadHealth>,
    /// Local copy of whether `health` says failing (so a success costs no lock when nothing changes).
    pub(super) failing: bool,
    /// The dedicated connection, once connected.
    pub(super) dedicated: Option<Dedicated>,
    /// Where the next dedicated connection goes: where a redirect said, or the slot's master (by a slot map read
    /// again after a failed connection: a failover may have moved the shard's slot).
    pub(super) route: KeyRoute,
    /// Redirects since the last successful read (a second one in a row waits like an error).
    pub(super) redirects: u32,
    /// Backoff after Redis errors; reset by a success.
    pub(super) redis_backoff: Option<ExponentialBackoff>,
    /// Entries handled and not yet acknowledged (still in flight), for the next batched `XACK`.
    pub(super) acks: AckBatch<InFlightGuard>,
    /// When the last claim of pending entries finished (see [`ReaderShared::reclaim_every`]).
    pub(super) last_claim: Instant,
}

/// A stream reply this build cannot parse, as a Redis error.
pub(super) fn reply_error(e: stream_reply::ReplyError) -> RedisError {
    RedisError::from((redis::ErrorKind::Parse, "unexpected stream reply", e.to_string()))
}
