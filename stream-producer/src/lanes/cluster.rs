//! The cluster route: per-node lanes, and one shard's pipeline sent straight to the master of its slot with every
//! redirect followed per command (see "Redis Cluster" in the [`publisher`](super) docs).
//!
//! Why not redis-rs's cluster connection: when one reply of a pipeline is a redirect (or the connection fails) it
//! sends the *whole* pipeline again, so the commands before the redirect run twice. Here a command is sent again
//! only when its own reply says it did not run (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`), or when it was never
//! sent (no connection); a connection that fails after sending leaves its commands unknown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::names::StreamName;
use protocol::{keys, ShardId};
use redis::{AsyncConnectionConfig, Cmd, RedisError, RedisResult, ServerErrorKind, Value};
use redis_link::{NodeAddr, NodePool, Redirect, RedirectKind, TopologyError};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{CmdOutcome, ConnectFailure, Durable, Lane, LaneError, LaneTimeouts, RedisGate, Replication};
use crate::stats::Stats;

/// Most `MOVED`/`ASK` rounds one call follows in a row (a backoff after `TRYAGAIN` starts the count again): more
/// means the nodes disagree about the slot, and the call fails as not written instead of bouncing.
pub(crate) const MAX_REDIRECTS: u32 = 5;

/// First wait before sending again after `TRYAGAIN`, `CLUSTERDOWN` or an unreachable node; doubles per wait.
const BACKOFF_MIN: Duration = Duration::from_millis(10);

/// Longest such wait.
const BACKOFF_MAX: Duration = Duration::from_millis(200);

/// The per-node lanes of a cluster, its slot map, and the order of each shard's pipelines.
pub(crate) struct ClusterRoute {
    pool: NodePool,
    timeouts: LaneTimeouts,
    connections: usize,
    /// Loads the publish script on every new node connection (scripted path).
    pub(super) preload_script: bool,
    /// What each node's check requires beyond the producer's commands (`WAIT` for durable writes).
    pub(super) also_require: Option<&'static client_core::RedisRequirements>,
    /// How long after a call started it may still send commands again (one response timeout).
    retry_window: Duration,
    /// The lanes of every node written to so far (bounded by the cluster's nodes).
    nodes: Mutex<HashMap<NodeAddr, Arc<Vec<Lane>>>>,
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

/// How a reply sends its command on.
enum Next {
    /// Settled: a reply of the command itself.
    Done,
    /// `MOVED` (to the node) or `ASK` (to the node, with `ASKING`).
    Redirect(Redirect),
    /// `TRYAGAIN` or `CLUSTERDOWN`: not run, send it again later.
    Retry,
}

fn next_of(reply: &RedisResult<Value>) -> Next {
    let Err(e) = reply else { return Next::Done };
    if let Some(redirect) = Redirect::from_error(e) {
        return Next::Redirect(redirect);
    }
    match e.kind() {
        redis::ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => Next::Retry,
        _ => Next::Done,
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
    pub(super) fn new(seeds: &[String], timeouts: LaneTimeouts, connections: usize) -> Result<Self, RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response));
        Ok(ClusterRoute {
            pool: NodePool::new(seeds, config)?,
            timeouts,
            connections: connections.max(1),
            preload_script: false,
            also_require: None,
            retry_window: timeouts.response,
            nodes: Mutex::default(),
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
        let mut nodes = self
            .nodes
            .lock()
            .expect("the node lanes lock is never held across a panic");
        if let Some(lanes) = nodes.get(node) {
            return Ok(lanes.clone());
        }
        let client = self.pool.client(node).map_err(|e| ConnectFailure::Redis(Arc::new(e)))?;
        let gate = Arc::new(RedisGate::new(format!("redis://{node}"), self.also_require));
        let lanes: Arc<Vec<Lane>> = Arc::new(
            (0..self.connections)
                .map(|_| Lane::new(gate.clone(), client.clone(), self.timeouts, self.preload_script))
                .collect(),
        );
        nodes.insert(node.clone(), lanes.clone());
        Ok(lanes)
    }

    /// Reads the slot map and opens every lane of every master.
    pub(super) async fn connect_all(&self) -> Result<(), ConnectFailure> {
        let map = self.pool.slot_map().await.map_err(topology_failure)?;
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
        let node = self.pool.slot_map().await.ok().map(|map| map.master_of(slot).clone());
        // `None`: the slot's master by the map; else the node a redirect named, and whether it was `ASK`.
        let mut to: Option<(NodeAddr, bool)> = node.map(|n| (n, false));
        if ticket.before_send(to.as_ref().map(|(n, _)| n), settling).await {
            // Every earlier pipeline of the shard settled: go where the map says now.
            to = None;
        }
        let commands: Vec<&Cmd> = pipe.cmd_iter().collect();
        let mut out: Vec<Option<CmdOutcome>> = (0..commands.len()).map(|_| None).collect();
        // The commands still to send, in order, with the last answer that sent them on.
        let mut pending: Vec<(usize, Option<RedisError>)> = (0..commands.len()).map(|i| (i, None)).collect();
        let deadline = Instant::now() + self.retry_window;
        let mut backoff = BACKOFF_MIN;
        let mut redirects = 0u32;
        let mut first = true;
        let mut replication = Replication::Confirmed;
        let finish = |out: &mut Vec<Option<CmdOutcome>>,
                      pending: &[(usize, Option<RedisError>)],
                      f: &dyn Fn(Option<&RedisError>) -> CmdOutcome| {
            for (i, last) in pending {
                out[*i] = Some(f(last.as_ref()));
            }
        };
        while !pending.is_empty() {
            let target = match &to {
                Some((node, asking)) => Ok((node.clone(), *asking)),
                None => self
                    .pool
                    .slot_map()
                    .await
                    .map(|map| (map.master_of(slot).clone(), false))
                    .map_err(topology_failure),
            };
            let sent = match target.and_then(|(node, asking)| Ok((self.lanes(&node)?, node, asking))) {
                Err(f) => Err(LaneError::Connect(f)),
                Ok((lanes, node, asking)) => {
                    ticket.sent(&node);
                    let lane = &lanes[shard.index() % lanes.len()];
                    match (first && !asking, durable) {
                        (true, None) => lane.run(pipe).await,
                        // WAIT behind the pipeline, without copying its commands into another one.
                        (true, Some(d)) => {
                            let parts = vec![bytes::Bytes::from(pipe.get_packed_pipeline()), d.packed()];
                            lane.run_packed(parts, commands.len() + 1).await
                        }
                        (false, _) => {
                            let mut again = redis::pipe();
                            again.ignore_errors();
                            for (i, _) in &pending {
                                if asking {
                                    again.cmd("ASKING").ignore();
                                }
                                again.add_command(commands[*i].clone());
                            }
                            if let Some(d) = durable {
                                again.add_command(d.command());
                            }
                            lane.run(&again).await
                        }
                    }
                }
            };
            first = false;
            // Whatever came back, nothing of this pipeline is sent again before its predecessor settled.
            ticket.after_prev().await;
            let mut replies = match sent {
                Ok(replies) => replies,
                Err(LaneError::Connect(f @ ConnectFailure::Unsupported(_))) => {
                    finish(&mut out, &pending, &|_| CmdOutcome::Connect(f.clone()));
                    break;
                }
                Err(LaneError::Connect(f)) => {
                    // Not sent. The node may be gone (a failover moves its slots): read the map again, then retry
                    // until the deadline.
                    ticket.settling();
                    let _ = self.pool.refresh().await;
                    to = None;
                    if Instant::now() + backoff > deadline {
                        finish(&mut out, &pending, &|_| CmdOutcome::Connect(f.clone()));
                        break;
                    }
                    stats
                        .cluster_retries
                        .fetch_add(pending.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
                Err(LaneError::Lost(e)) => {
                    let e = Arc::new(e);
                    finish(&mut out, &pending, &|_| CmdOutcome::Lost(e.clone()));
                    break;
                }
            };
            // The WAIT's reply, when it is there: the last.
            let wait = match durable {
                Some(_) if replies.len() == pending.len() + 1 => replies.pop(),
                _ => None,
            };
            if replies.len() != pending.len() {
                let detail = format!("{} replies to {} commands", replies.len(), pending.len());
                finish(&mut out, &pending, &|_| CmdOutcome::Unexpected(detail.clone()));
                break;
            }
            let mut next = Vec::new();
            let (mut moved, mut asked, mut retry) = (0u64, 0u64, 0u64);
            let mut ran = false;
            for ((i, _), reply) in pending.iter().zip(replies) {
                match next_of(&reply) {
                    Next::Done => {
                        ran = true;
                        out[*i] = Some(CmdOutcome::Reply(reply));
                    }
                    Next::Redirect(redirect) => {
                        if next.is_empty() {
                            to = Some((redirect.to.clone(), redirect.kind == RedirectKind::Ask));
                        }
                        match redirect.kind {
                            RedirectKind::Moved => moved += 1,
                            RedirectKind::Ask => asked += 1,
                        }
                        next.push((*i, reply.err()));
                    }
                    Next::Retry => {
                        if next.is_empty() {
                            to = None;
                        }
                        retry += 1;
                        next.push((*i, reply.err()));
                    }
                }
            }
            if let Some(d) = durable.filter(|_| ran) {
                replication = replication.and(d.read_outcome(wait.map(CmdOutcome::Reply)));
            }
            pending = next;
            if pending.is_empty() {
                break;
            }
            ticket.settling();
            {
                use std::sync::atomic::Ordering::Relaxed;
                stats.redirects_moved.fetch_add(moved, Relaxed);
                stats.redirects_ask.fetch_add(asked, Relaxed);
                stats.cluster_retries.fetch_add(retry, Relaxed);
            }
            if moved > 0 {
                // The redirect named the new owner; the map is for the pipelines after this one.
                let _ = self.pool.refresh().await;
            }
            if moved + asked > 0 {
                redirects += 1;
                if redirects > MAX_REDIRECTS {
                    finish(&mut out, &pending, &|last| {
                        CmdOutcome::Unsettled("too many redirects", Arc::new(last.cloned().unwrap_or_else(no_answer)))
                    });
                    break;
                }
            }
            // Only ASK is expected to be followed at once; a second redirect in a row means the nodes' views
            // have not converged yet: give them a moment.
            if retry > 0 || redirects > 1 {
                if Instant::now() + backoff > deadline {
                    finish(&mut out, &pending, &|last| {
                        CmdOutcome::Unsettled(
                            "retried until the response timeout",
                            Arc::new(last.cloned().unwrap_or_else(no_answer)),
                        )
                    });
                    break;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                if retry > 0 {
                    redirects = 0;
                }
            }
        }
        let out = out
            .into_iter()
            .map(|o| o.unwrap_or_else(|| CmdOutcome::Unexpected("no outcome".into())))
            .collect();
        (out, replication)
    }
}

fn no_answer() -> RedisError {
    RedisError::from((redis::ErrorKind::ClusterConnectionNotFound, "no answer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> ClusterRoute {
        ClusterRoute::new(
            &["redis://127.0.0.1:1".to_owned()],
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

    #[test]
    fn redirects_and_retries_are_told_apart() {
        let reply = |text: &str| match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap() {
            Value::ServerError(e) => Err(RedisError::from(e)),
            other => panic!("{other:?}"),
        };
        assert!(matches!(
            next_of(&reply("MOVED 12 10.0.0.2:7001")),
            Next::Redirect(Redirect {
                kind: RedirectKind::Moved,
                slot: 12,
                ..
            })
        ));
        assert!(matches!(
            next_of(&reply("ASK 12 10.0.0.2:7001")),
            Next::Redirect(Redirect {
                kind: RedirectKind::Ask,
                ..
            })
        ));
        assert!(matches!(
            next_of(&reply("TRYAGAIN Multiple keys request during rehashing of slot")),
            Next::Retry
        ));
        assert!(matches!(
            next_of(&reply("CLUSTERDOWN The cluster is down")),
            Next::Retry
        ));
        assert!(matches!(next_of(&reply("ERR wrong number of arguments")), Next::Done));
        assert!(matches!(next_of(&reply("NOSCRIPT No matching script")), Next::Done));
        assert!(matches!(next_of(&Ok(Value::Okay)), Next::Done));
    }
}
