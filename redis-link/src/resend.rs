//! One pipeline sent to the master of a slot with every command's redirect followed on its own
//! (`ClusterRouter::run_pipeline`).
//!
//! Why not redis-rs's cluster connection: when one reply of a pipeline is a redirect (or the connection fails) it
//! sends the *whole* pipeline again, so the commands before the redirect run twice. Here a command is sent again
//! only when its own reply says it did not run (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`), or when it was never
//! sent (no connection); a connection that fails after sending leaves its commands unknown
//! ([`CommandOutcome::Lost`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::{RedisError, RedisResult, ServerErrorKind, Value};
use tokio::time::Instant;

use crate::redirect::{Redirect, RedirectKind};
use crate::router::ClusterRouter;
use crate::topology::{NodeAddr, TopologyError};

/// Most `MOVED`/`ASK` rounds one pipeline follows in a row (a backoff after `TRYAGAIN` starts the count again):
/// more means the nodes disagree about the slot, and its commands fail as not run instead of bouncing.
pub const MAX_REDIRECTS: u32 = 5;

/// First wait before sending again after `TRYAGAIN`, `CLUSTERDOWN` or an unreachable node; doubles per wait.
pub const BACKOFF_MIN: Duration = Duration::from_millis(10);

/// Longest such wait.
pub const BACKOFF_MAX: Duration = Duration::from_millis(200);

/// What a reply says about its command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyKind {
    /// The command's own reply (a value or an error of the command): it settled.
    Done,
    /// `MOVED` (go to the node from now on) or `ASK` (this command only, with `ASKING`): it did not run.
    Redirect(Redirect),
    /// `TRYAGAIN` or `CLUSTERDOWN`: it did not run; send it again later.
    Retry,
}

impl ReplyKind {
    /// The kind of `reply`.
    pub fn of(reply: &RedisResult<Value>) -> Self {
        let Err(e) = reply else { return ReplyKind::Done };
        if let Some(redirect) = Redirect::from_error(e) {
            return ReplyKind::Redirect(redirect);
        }
        match e.kind() {
            redis::ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => ReplyKind::Retry,
            _ => ReplyKind::Done,
        }
    }
}

/// How long a pipeline may keep sending commands again.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// From the pipeline's start: no resend after it (one response timeout is the producer's choice).
    pub window: Duration,
    /// Redirect rounds in a row, at most.
    pub max_redirects: u32,
}

/// One request [`ClusterRouter::run_pipeline`] asks its driver to send.
#[derive(Debug)]
pub struct NodeRequest<'a> {
    /// Where to.
    pub node: &'a NodeAddr,
    /// Whether every command goes, for the first time, to the slot's master: the driver may send the
    /// pipeline as it was built (else it sends `commands` of it, each after `ASKING` when `asking`).
    pub whole: bool,
    /// Each of the commands must be preceded by `ASKING` (an `ASK` redirect).
    pub asking: bool,
    /// Indices of the pipeline's commands to send, in order.
    pub commands: &'a [usize],
}

/// Why a request was not answered.
#[derive(Debug)]
pub enum SendError<E> {
    /// No connection to the node: nothing was sent; sent again after a slot map refresh and a backoff.
    Unreachable(E),
    /// Nothing was sent and nothing will be (the node cannot serve the caller): the commands fail with it.
    Refused(E),
    /// Handed to an open connection, then failed: the commands may have run.
    Lost(RedisError),
}

/// Commands about to be sent again, by cause (for the caller's counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resends {
    /// Answered `MOVED`.
    pub moved: u64,
    /// Answered `ASK`.
    pub asked: u64,
    /// Answered `TRYAGAIN` / `CLUSTERDOWN`, or not sent (node unreachable).
    pub retried: u64,
}

/// The caller's side of [`ClusterRouter::run_pipeline`]: how a request is sent, and hooks for its own order.
pub trait PipelineDriver: Send {
    /// Why a node could not be used.
    type Error: Clone + Send + Sync;

    /// The error of a slot whose master is unknown (no slot map could be read).
    fn no_route(&self, e: TopologyError) -> Self::Error;

    /// Sends `request`; one reply per command of it (a driver that adds a command of its own, such as `WAIT`,
    /// takes its reply off).
    fn send(
        &mut self,
        request: NodeRequest<'_>,
    ) -> impl Future<Output = Result<Vec<RedisResult<Value>>, SendError<Self::Error>>> + Send;

    /// After every answer or failure, before anything is sent again.
    fn answered(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Some commands will (probably) be sent again: called before the slot map refresh and the backoff.
    fn settling(&mut self) {}

    /// Commands are sent again now.
    fn resent(&mut self, _resends: Resends) {}
}

/// What became of one command.
#[derive(Debug, Clone)]
pub enum CommandOutcome<E> {
    /// Its own reply.
    Reply(RedisResult<Value>),
    /// Never sent: no node could take it in time, or the node refused the caller.
    NotSent(E),
    /// Sent on a connection that failed before answering: it may have run.
    Lost(Arc<RedisError>),
    /// Redirected or told to retry until a bound was reached (the reason); it did not run.
    Unsettled(&'static str, Arc<RedisError>),
    /// The answer did not fit the request.
    Unexpected(String),
}

/// The state of one [`ClusterRouter::run_pipeline`] call.
struct Run<E> {
    out: Vec<Option<CommandOutcome<E>>>,
    /// The commands still to send, in order, with the last answer that sent them on.
    pending: Vec<(usize, Option<RedisError>)>,
    deadline: Instant,
    backoff: Duration,
    redirects: u32,
    max_redirects: u32,
}

impl<E: Clone> Run<E> {
    fn new(count: usize, policy: RetryPolicy) -> Self {
        Run {
            out: (0..count).map(|_| None).collect(),
            pending: (0..count).map(|i| (i, None)).collect(),
            deadline: Instant::now() + policy.window,
            backoff: BACKOFF_MIN,
            redirects: 0,
            max_redirects: policy.max_redirects,
        }
    }

    fn finish(&mut self, f: impl Fn(Option<&RedisError>) -> CommandOutcome<E>) {
        for (i, last) in std::mem::take(&mut self.pending) {
            self.out[i] = Some(f(last.as_ref()));
        }
    }

    fn unsettled(&mut self, reason: &'static str) {
        self.finish(|last| CommandOutcome::Unsettled(reason, Arc::new(last.cloned().unwrap_or_else(no_answer))));
    }

    /// Waits the backoff unless that passes the deadline: whether it waited.
    async fn wait(&mut self) -> bool {
        if Instant::now() + self.backoff > self.deadline {
            return false;
        }
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        true
    }

    /// Settles the commands `replies` answer; the rest stay pending. Answers where the first of them goes next
    /// (`None`: the slot's master by the map) and the counts.
    fn read(&mut self, replies: Vec<RedisResult<Value>>) -> (Option<Option<(NodeAddr, bool)>>, Resends) {
        let mut next = Vec::new();
        let mut to = None;
        let mut counts = Resends::default();
        for ((i, _), reply) in std::mem::take(&mut self.pending).into_iter().zip(replies) {
            match ReplyKind::of(&reply) {
                ReplyKind::Done => self.out[i] = Some(CommandOutcome::Reply(reply)),
                ReplyKind::Redirect(redirect) => {
                    if next.is_empty() {
                        to = Some(Some((redirect.to.clone(), redirect.kind == RedirectKind::Ask)));
                    }
                    match redirect.kind {
                        RedirectKind::Moved => counts.moved += 1,
                        RedirectKind::Ask => counts.asked += 1,
                    }
                    next.push((i, reply.err()));
                }
                ReplyKind::Retry => {
                    if next.is_empty() {
                        to = Some(None);
                    }
                    counts.retried += 1;
                    next.push((i, reply.err()));
                }
            }
        }
        self.pending = next;
        (to, counts)
    }
}

impl<N> ClusterRouter<N> {
    /// Runs a pipeline of `count` commands, all keyed in `slot` (or keyless), on the slot's master, through
    /// `driver`, following each command's redirect on its own (see the module docs); one outcome per command.
    ///
    /// `first` is where the first request goes (the caller may have looked it up to order its pipelines);
    /// `None`: the slot's master by the current map. The pipeline's commands are sent again only while
    /// `policy` allows, with a backoff (10 ms doubling to 200 ms) after `TRYAGAIN`, `CLUSTERDOWN`, an unreachable
    /// node, or a second redirect in a row; a `MOVED` also refreshes the slot map for later pipelines.
    pub async fn run_pipeline<D: PipelineDriver>(
        &self,
        slot: u16,
        count: usize,
        first: Option<NodeAddr>,
        policy: RetryPolicy,
        driver: &mut D,
    ) -> Vec<CommandOutcome<D::Error>> {
        let mut run = Run::new(count, policy);
        // `None`: the slot's master by the map; else the node, and whether with `ASKING`.
        let mut to: Option<(NodeAddr, bool)> = first.map(|n| (n, false));
        let mut whole = true;
        let mut indices: Vec<usize> = Vec::new();
        while !run.pending.is_empty() {
            let target = match to.take() {
                Some(target) => Ok(target),
                None => self.master_of_slot(slot).await.map(|n| (n, false)),
            };
            let sent = match target {
                Err(e) => Err(SendError::Unreachable(driver.no_route(e))),
                Ok((node, asking)) => {
                    indices.clear();
                    indices.extend(run.pending.iter().map(|(i, _)| *i));
                    let request = NodeRequest {
                        node: &node,
                        whole: whole && !asking,
                        asking,
                        commands: &indices,
                    };
                    driver.send(request).await
                }
            };
            whole = false;
            // Whatever came back, nothing is sent again before the caller's order allows it.
            driver.answered().await;
            let replies = match sent {
                Ok(replies) => replies,
                Err(SendError::Refused(e)) => {
                    run.finish(|_| CommandOutcome::NotSent(e.clone()));
                    break;
                }
                Err(SendError::Unreachable(e)) => {
                    to = None;
                    if self.unreachable(&mut run, e, driver).await {
                        continue;
                    }
                    break;
                }
                Err(SendError::Lost(e)) => {
                    let e = Arc::new(e);
                    run.finish(|_| CommandOutcome::Lost(e.clone()));
                    break;
                }
            };
            if replies.len() != run.pending.len() {
                let detail = format!("{} replies to {} commands", replies.len(), run.pending.len());
                run.finish(|_| CommandOutcome::Unexpected(detail.clone()));
                break;
            }
            let (next, counts) = run.read(replies);
            if run.pending.is_empty() {
                break;
            }
            to = next.flatten();
            if !self.after_resends(&mut run, counts, driver).await {
                break;
            }
        }
        run.out
            .into_iter()
            .map(|o| o.unwrap_or_else(|| CommandOutcome::Unexpected("no outcome".into())))
            .collect()
    }

    /// After a node could not be reached (nothing sent): the map read again (a failover may have moved the
    /// slot), then a backoff, unless that passes the deadline (then the commands are not sent). Whether they may
    /// go again.
    async fn unreachable<D: PipelineDriver>(&self, run: &mut Run<D::Error>, e: D::Error, driver: &mut D) -> bool {
        driver.settling();
        let _ = self.refresh().await;
        let retried = run.pending.len() as u64;
        if Instant::now() + run.backoff > run.deadline {
            run.finish(|_| CommandOutcome::NotSent(e.clone()));
            return false;
        }
        driver.resent(Resends {
            retried,
            ..Resends::default()
        });
        run.wait().await;
        true
    }

    /// Before commands answered with a redirect or a retry go again: counts, refresh, bounds, backoff. Whether
    /// they may go.
    async fn after_resends<D: PipelineDriver>(&self, run: &mut Run<D::Error>, counts: Resends, driver: &mut D) -> bool {
        driver.settling();
        driver.resent(counts);
        if counts.moved > 0 {
            // The redirect named the new owner; the map is for the pipelines after this one.
            let _ = self.refresh().await;
        }
        if counts.moved + counts.asked > 0 {
            run.redirects += 1;
            if run.redirects > run.max_redirects {
                run.unsettled("too many redirects");
                return false;
            }
        }
        // Only ASK is expected to be followed at once; a second redirect in a row means the nodes' views have not
        // converged yet: give them a moment.
        if counts.retried > 0 || run.redirects > 1 {
            if !run.wait().await {
                run.unsettled("retried until the response timeout");
                return false;
            }
            if counts.retried > 0 {
                run.redirects = 0;
            }
        }
        true
    }
}

fn no_answer() -> RedisError {
    RedisError::from((redis::ErrorKind::ClusterConnectionNotFound, "no answer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(text: &str) -> RedisResult<Value> {
        match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap() {
            Value::ServerError(e) => Err(RedisError::from(e)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn redirects_and_retries_are_told_apart() {
        assert!(matches!(
            ReplyKind::of(&reply("MOVED 12 10.0.0.2:7001")),
            ReplyKind::Redirect(Redirect {
                kind: RedirectKind::Moved,
                slot: 12,
                ..
            })
        ));
        assert!(matches!(
            ReplyKind::of(&reply("ASK 12 10.0.0.2:7001")),
            ReplyKind::Redirect(Redirect {
                kind: RedirectKind::Ask,
                ..
            })
        ));
        let tryagain = reply("TRYAGAIN Multiple keys request during rehashing of slot");
        assert_eq!(ReplyKind::of(&tryagain), ReplyKind::Retry);
        assert_eq!(
            ReplyKind::of(&reply("CLUSTERDOWN The cluster is down")),
            ReplyKind::Retry
        );
        assert_eq!(ReplyKind::of(&reply("ERR wrong number of arguments")), ReplyKind::Done);
        assert_eq!(ReplyKind::of(&reply("NOSCRIPT No matching script")), ReplyKind::Done);
        assert_eq!(ReplyKind::of(&Ok(Value::Okay)), ReplyKind::Done);
    }
}
