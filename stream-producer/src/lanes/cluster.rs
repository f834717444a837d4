//! The cluster route: per-node lanes, and the order of each shard's pipelines (see "Redis Cluster" in the
//! [`publisher`](super) docs). Where a pipeline goes and how each command's redirect is followed is
//! [`redis_link::ClusterRouter::run_pipeline`]'s: a command is sent again only when its own reply says it did not
//! run (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`), or when it was never sent (no connection); a connection that
//! fails after sending leaves its commands unknown. What stays here is the producer's: its lanes per node (each
//! node checked, the publish script loaded), the `WAIT` of a durable write, the order of a shard's pipelines and
//! the counters.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use protocol::names::StreamName;
use protocol::{keys, ShardId};
use redis::{AsyncConnectionConfig, Cmd, RedisError, RedisResult, Value};
use redis_link::{
    ClusterRouter, CommandOutcome, NodeAddr, NodeRequest, PipelineDriver, ReplyKind, Resends, RetryPolicy, SendError,
    TopologyError,
};
use tokio::sync::oneshot;

use super::durable::{Durable, Replication};
use super::gate::{AclProbes, ConnectFailure, RedisGate};
use super::lane::{CmdOutcome, Lane, LaneError, LaneTimeouts};
use crate::stats::Stats;

/// Most `MOVED`/`ASK` rounds one call follows in a row (see [`redis_link::MAX_REDIRECTS`]).
pub(crate) const MAX_REDIRECTS: u32 = redis_link::MAX_REDIRECTS;

/// The per-node lanes of a cluster, its router, and the order of each shard's pipelines.
pub(crate) struct ClusterRoute {
    /// The slot map, the redirects, and every master's lanes.
    router: ClusterRouter<Vec<Lane>>,
    timeouts: LaneTimeouts,
    connections: usize,
    /// Loads the publish script on every new node connection (scripted path).
    pub(super) preload_script: bool,
    /// What each node's check requires beyond the producer's commands (`WAIT` for durable writes).
    pub(super) also_require: Option<&'static client_core::RedisRequirements>,
    /// What every node's check asks of the ACL user.
    pub(super) probes: Arc<AclProbes>,
    /// How long after a call started it may still send commands again (one response timeout).
    retry: RetryPolicy,
    /// Per shard written so far: the last pipeline issued, and how many are settling redirects.
    order: Mutex<HashMap<ShardId, ShardOrder>>,
}

#[derive(Default)]
struct ShardOrder {
    /// Resolves when the last pipeline issued for the shard has settled.
    done: Option<oneshot::Receiver<()>>,
    /// Resolves with the node the last pipeline issued was sent to, once it was.
    sent: Option<oneshot::Receiver<NodeAddr>>,
    /// Pipelines of the shard settling redirects or retries now.
    settling: usize,
}

/// A pipeline's place in its shard's order; settles when dropped.
struct Ticket<'a> {
    route: &'a ClusterRoute,
    shard: ShardId,
    prev: Option<oneshot::Receiver<()>>,
    prev_sent: Option<oneshot::Receiver<NodeAddr>>,
    sent: Option<oneshot::Sender<NodeAddr>>,
    settling: bool,
    _done: oneshot::Sender<()>,
}

impl Ticket<'_> {
    /// Waits until this pipeline may be sent to `node` (the slot's master by the map) without overtaking the
    /// shard's earlier pipelines: at once after the previous one was handed to the same node (one lane keeps
    /// their order); after the previous one settled when it went to another node, or when one of the shard's
    /// pipelines was settling redirects when this one was issued (`settling`). Answers whether it waited for the
    /// previous one to settle (then the slot map is worth reading again).
    async fn before_send(&mut self, node: Option<&NodeAddr>, settling: bool) -> bool {
        if !settling {
            let Some(prev_sent) = self.prev_sent.take() else {
                return false;
            };
            match prev_sent.await {
                Ok(prev) if Some(&prev) == node => return false,
                // Dropped unsent: the previous pipeline settled without sending anything more.
                Err(_) => return false,
                Ok(_) => {}
            }
        }
        self.after_prev().await;
        true
    }

    /// Tells the next pipeline of the shard where this one was sent (once, at its first send).
    fn sent(&mut self, node: &NodeAddr) {
        if let Some(tx) = self.sent.take() {
            let _ = tx.send(node.clone());
        }
    }

    /// Waits until the shard's previous pipeline settled (at once when it has, or when there is none).
    async fn after_prev(&mut self) {
        if let Some(prev) = self.prev.take() {
            // A dropped sender is the signal: the previous pipeline settled, however it ended.
            let _ = prev.await;
        }
    }

    /// Marks the pipeline as settling redirects: new pipelines of the shard wait for it before they are sent,
    /// so none of them reaches the slot's new node before the commands this one sends again.
    fn settling(&mut self) {
        if !self.settling {
            self.settling = true;
            self.route.orders().entry(self.shard).or_default().settling += 1;
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.settling {
            if let Some(order) = self.route.orders().get_mut(&self.shard) {
                order.settling = order.settling.saturating_sub(1);
            }
        }
    }
}

fn topology_failure(e: TopologyError) -> ConnectFailure {
    let e = match e {
        TopologyError::Unreachable(e) => e,
        other => RedisError::from((
            redis::ErrorKind::ClusterConnectionNotFound,
            "no usable cluster slot map",
            other.to_string(),
        )),
    };
    ConnectFailure::Redis(Arc::new(e))
}

impl ClusterRoute {
    pub(super) fn new(
        seeds: &[String],
        tls: Option<&redis_link::RedisTls>,
        timeouts: LaneTimeouts,
        connections: usize,
    ) -> Result<Self, RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response));
        Ok(ClusterRoute {
            router: ClusterRouter::new(seeds, config, tls)?,
            timeouts,
            connections: connections.max(1),
            preload_script: false,
            also_require: None,
            probes: Arc::new(AclProbes::none()),
            retry: RetryPolicy {
                window: timeouts.response,
                max_redirects: MAX_REDIRECTS,
            },
            order: Mutex::default(),
        })
    }

    fn orders(&self) -> std::sync::MutexGuard<'_, HashMap<ShardId, ShardOrder>> {
        self.order
            .lock()
            .expect("the shard order lock is never held across a panic")
    }

    /// The lanes of `node`, created on first use (each node has its own Redis check).
    fn lanes(&self, node: &NodeAddr) -> Result<Arc<Vec<Lane>>, ConnectFailure> {
        self.router.node_state(
            node,
            |client| {
                let gate = Arc::new(RedisGate::new(
                    format!("redis://{node}"),
                    self.also_require,
                    self.probes.clone(),
                ));
                Ok((0..self.connections)
                    .map(|_| {
                        let tls = self.router.pool().tls().cloned();
                        Lane::new(gate.clone(), client.clone(), tls, self.timeouts, self.preload_script)
                    })
                    .collect())
            },
            |e| ConnectFailure::Redis(Arc::new(e)),
        )
    }

    /// Reads the slot map and opens every lane of every master.
    pub(super) async fn connect_all(&self) -> Result<(), ConnectFailure> {
        let map = self.router.slot_map().await.map_err(topology_failure)?;
        for node in map.masters() {
            for lane in self.lanes(&node)?.iter() {
                lane.connection().await?;
            }
        }
        Ok(())
    }

    /// The next place in `shard`'s order, and whether one of the shard's pipelines is settling redirects now.
    fn ticket(&self, shard: ShardId) -> (Ticket<'_>, bool) {
        let (done, done_rx) = oneshot::channel();
        let (sent, sent_rx) = oneshot::channel();
        let mut orders = self.orders();
        let order = orders.entry(shard).or_default();
        let prev = order.done.replace(done_rx);
        let prev_sent = order.sent.replace(sent_rx);
        let settling = order.settling > 0;
        drop(orders);
        let ticket = Ticket {
            route: self,
            shard,
            prev,
            prev_sent,
            sent: Some(sent),
            settling: false,
            _done: done,
        };
        (ticket, settling)
    }

    /// Runs one shard's pipeline (every command keyed in the shard's slot, or keyless; none ignored) on the master
    /// of the slot, following each command's redirect. One outcome per command of `pipe`. When `durable`, every
    /// request sent for it ends with `WAIT` on the node that takes it, and the answer says what the `WAIT`s of the
    /// requests that ran commands confirmed (the weakest of them).
    pub(super) async fn run(
        &self,
        stats: &Stats,
        stream: &StreamName,
        shard: ShardId,
        pipe: &redis::Pipeline,
        durable: Option<&Durable>,
    ) -> (Vec<CmdOutcome>, Replication) {
        let slot = protocol::slot::key_slot(keys::shard_stream(stream, shard).as_bytes());
        let (mut ticket, settling) = self.ticket(shard);
        let node = self.router.master_of_slot(slot).await.ok();
        // Every earlier pipeline of the shard settled when it waited: then go where the map says now.
        let first = if ticket.before_send(node.as_ref(), settling).await {
            None
        } else {
            node
        };
        let commands: Vec<&Cmd> = pipe.cmd_iter().collect();
        let mut driver = Driver {
            route: self,
            ticket,
            stats,
            shard,
            pipe,
            commands: &commands,
            durable,
            replication: Replication::Confirmed,
        };
        let outcomes = self
            .router
            .run_pipeline(slot, commands.len(), first, self.retry, &mut driver)
            .await;
        let outcomes = outcomes
            .into_iter()
            .map(|o| match o {
                CommandOutcome::Reply(reply) => CmdOutcome::Reply(reply),
                CommandOutcome::NotSent(f) => CmdOutcome::Connect(f),
                CommandOutcome::Lost(e) => CmdOutcome::Lost(e),
                CommandOutcome::Unsettled(reason, e) => CmdOutcome::Unsettled(reason, e),
                CommandOutcome::Unexpected(detail) => CmdOutcome::Unexpected(detail),
            })
            .collect();
        (outcomes, driver.replication)
    }
}

/// How one shard's pipeline is sent: on the lanes of the node the router names, with `WAIT` when durable, in
/// the shard's order.
struct Driver<'a> {
    route: &'a ClusterRoute,
    ticket: Ticket<'a>,
    stats: &'a Stats,
    shard: ShardId,
    pipe: &'a redis::Pipeline,
    commands: &'a [&'a Cmd],
    durable: Option<&'a Durable>,
    /// What the `WAIT`s of the requests that ran commands confirmed so far.
    replication: Replication,
}

impl Driver<'_> {
    /// The request's commands as a pipeline of their own (sent again after a redirect or a retry).
    fn again(&self, request: &NodeRequest<'_>) -> redis::Pipeline {
        let mut again = redis::pipe();
        again.ignore_errors();
        for &i in request.commands {
            if request.asking {
                again.cmd("ASKING").ignore();
            }
            again.add_command(self.commands[i].clone());
        }
        if let Some(d) = self.durable {
            again.add_command(d.command());
        }
        again
    }
}

impl PipelineDriver for Driver<'_> {
    type Error = ConnectFailure;

    fn no_route(&self, e: TopologyError) -> ConnectFailure {
        topology_failure(e)
    }

    async fn send(&mut self, request: NodeRequest<'_>) -> Result<Vec<RedisResult<Value>>, SendError<ConnectFailure>> {
        let lanes = self.route.lanes(request.node).map_err(SendError::Unreachable)?;
        self.ticket.sent(request.node);
        let lane = &lanes[self.shard.index() % lanes.len()];
        let sent = match (request.whole, self.durable) {
            (true, None) => lane.run(self.pipe).await,
            // WAIT behind the pipeline, without copying its commands into another one.
            (true, Some(d)) => {
                let parts = vec![bytes::Bytes::from(self.pipe.get_packed_pipeline()), d.packed()];
                lane.run_packed(parts, self.commands.len() + 1).await
            }
            (false, _) => lane.run(&self.again(&request)).await,
        };
        let mut replies = match sent {
            Ok(replies) => replies,
            Err(LaneError::Connect(f @ ConnectFailure::Unsupported(_))) => return Err(SendError::Refused(f)),
            Err(LaneError::Connect(f)) => return Err(SendError::Unreachable(f)),
            Err(LaneError::Lost(e)) => return Err(SendError::Lost(e)),
        };
        if let Some(d) = self.durable {
            // The WAIT's reply, when it is there: the last. It counts when a command of the request ran.
            let wait = (replies.len() == request.commands.len() + 1)
                .then(|| replies.pop())
                .flatten();
            let ran = replies.iter().any(|r| ReplyKind::of(r) == ReplyKind::Done);
            if replies.len() == request.commands.len() && ran {
                let replication = std::mem::replace(&mut self.replication, Replication::Confirmed);
                self.replication = replication.and(d.read_outcome(wait.map(CmdOutcome::Reply)));
            }
        }
        Ok(replies)
    }

    async fn answered(&mut self) {
        self.ticket.after_prev().await;
    }

    fn settling(&mut self) {
        self.ticket.settling();
    }

    fn resent(&mut self, resends: Resends) {
        self.stats.redirects_moved.fetch_add(resends.moved, Relaxed);
        self.stats.redirects_ask.fetch_add(resends.asked, Relaxed);
        self.stats.cluster_retries.fetch_add(resends.retried, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn route() -> ClusterRoute {
        ClusterRoute::new(
            &["redis://127.0.0.1:1".to_owned()],
            None,
            LaneTimeouts {
                connect: Duration::from_secs(1),
                response: Duration::from_secs(1),
            },
            2,
        )
        .unwrap()
    }

    /// Polls `f` once: whether it finished.
    async fn ready_now(f: impl std::future::Future<Output = bool>) -> Option<bool> {
        let mut f = std::pin::pin!(f);
        match futures::poll!(f.as_mut()) {
            std::task::Poll::Ready(waited) => Some(waited),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn a_pipeline_follows_its_predecessor_to_the_same_node_at_once() {
        let route = route();
        let (a, b) = (NodeAddr::new("10.0.0.1", 7000), NodeAddr::new("10.0.0.2", 7001));
        let (mut first, settling) = route.ticket(ShardId(0));
        assert!(!settling);
        assert_eq!(
            ready_now(first.before_send(Some(&a), false)).await,
            Some(false),
            "the first goes at once"
        );
        let (mut second, _) = route.ticket(ShardId(0));
        let (mut third, _) = route.ticket(ShardId(0));
        {
            let mut waiting = std::pin::pin!(second.before_send(Some(&a), false));
            assert!(
                futures::poll!(waiting.as_mut()).is_pending(),
                "the first is not sent yet"
            );
            first.sent(&a);
            assert!(!waiting.await, "same node, sent: go, without waiting for it to settle");
        }
        second.sent(&a);
        let (mut other, _) = route.ticket(ShardId(1));
        assert_eq!(
            ready_now(other.before_send(Some(&b), false)).await,
            Some(false),
            "shards are apart"
        );
        // The map moved the slot: the third goes to b once the second (sent to a) settled, never before.
        {
            let mut waiting = std::pin::pin!(third.before_send(Some(&b), false));
            assert!(futures::poll!(waiting.as_mut()).is_pending());
            drop(first);
            assert!(
                futures::poll!(waiting.as_mut()).is_pending(),
                "the second has not settled"
            );
            drop(second);
            assert!(waiting.await, "waited for the second to settle");
        }
        third.sent(&b);
        let (mut fourth, _) = route.ticket(ShardId(0));
        assert_eq!(ready_now(fourth.before_send(Some(&b), false)).await, Some(false));
    }

    #[tokio::test]
    async fn new_pipelines_wait_while_one_of_their_shard_settles_redirects() {
        let route = route();
        let a = NodeAddr::new("10.0.0.1", 7000);
        let (mut settling, _) = route.ticket(ShardId(3));
        settling.sent(&a);
        settling.settling();
        settling.settling();
        let (mut next, is_settling) = route.ticket(ShardId(3));
        assert!(is_settling, "a pipeline of the shard is settling");
        {
            let mut waiting = std::pin::pin!(next.before_send(Some(&a), true));
            assert!(futures::poll!(waiting.as_mut()).is_pending(), "even to the same node");
            drop(settling);
            assert!(
                tokio::time::timeout(Duration::from_secs(1), waiting)
                    .await
                    .expect("settled"),
                "it waited for the settling one"
            );
        }
        next.sent(&a);
        drop(next);
        let (mut last, is_settling) = route.ticket(ShardId(3));
        assert!(!is_settling, "nothing is settling any more");
        assert_eq!(ready_now(last.before_send(Some(&a), false)).await, Some(false));
    }
}
