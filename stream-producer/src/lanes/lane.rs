//! One lane: a pipelining connection ([`redis_link::PipelinedConnection`]) shared by every request given to it,
//! opened lazily (single flight), checked by its server's [`RedisGate`] before its first use, and replaced after
//! a transport error; and what one command sent on it came to ([`CmdOutcome`]).
//!
//! The lane knows whether a request left: a failure to *open* the connection means nothing was sent
//! ([`LaneError::Connect`]); a failure after the pipeline was handed to an open connection (reset, EOF, timeout)
//! means Redis may have executed any prefix of it ([`LaneError::Lost`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{RedisError, Value};
use redis_link::PipelinedConnection;

use super::gate::{ConnectFailure, RedisGate};
use crate::config::ProducerConfig;
use crate::publish_script::PublishScript;

/// The timeouts of every lane's connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneTimeouts {
    /// Opening a connection (and its `AUTH` / `SELECT`).
    pub(crate) connect: Duration,
    /// Waiting for the replies of one request.
    pub(crate) response: Duration,
}

impl LaneTimeouts {
    /// The producer's Redis timeouts.
    pub(crate) fn of(config: &ProducerConfig) -> Self {
        LaneTimeouts {
            connect: config.redis_connect_timeout,
            response: config.redis_response_timeout,
        }
    }
}

/// One pipelining connection, opened lazily and replaced after a transport error.
pub(crate) struct Lane {
    gate: Arc<RedisGate>,
    client: redis::Client,
    /// The TLS settings `client` was opened with, for the pipelined connection (`rediss://`).
    tls: Option<redis_link::RedisTls>,
    timeouts: LaneTimeouts,
    /// The open connection and its generation (so a stale failure does not drop a newer connection).
    /// A std mutex: held only to clone or swap the handle.
    current: Mutex<Option<(u64, PipelinedConnection)>>,
    /// Serialises connection attempts (single flight): a burst of publishes opens one connection, not one each.
    connecting: tokio::sync::Mutex<ConnectState>,
    /// Mirror of `ConnectState::attempts`, readable without waiting for the lock.
    attempts: AtomicU64,
    /// Callers on the slow path of [`Lane::connection`] (queued behind a connection attempt or making one). While
    /// any are, a new caller queues too instead of taking an open connection at once: the lock is FIFO, so the
    /// pipelines of one shard reach the connection in the order they were issued (a pipeline issued after the
    /// connection opened must not overtake one that was waiting for it).
    waiting: AtomicU64,
    generation: AtomicU64,
    /// Loads the publish script on every new connection (scripted path).
    preload_script: bool,
}

/// What the last connection attempt left behind.
#[derive(Default)]
struct ConnectState {
    /// Finished attempts so far. A caller that waited through someone else's failed attempt shares its error
    /// instead of trying again at once: Redis being down must not cost one connect timeout per waiting publish.
    attempts: u64,
    last_error: Option<ConnectFailure>,
}

/// Why a lane could not run a pipeline.
pub(crate) enum LaneError {
    /// The connection could not be opened (or its server cannot serve the producer): nothing was sent.
    Connect(ConnectFailure),
    /// The pipeline was handed to an open connection and then failed: outcome unknown.
    Lost(RedisError),
}

impl Lane {
    pub(crate) fn new(
        gate: Arc<RedisGate>,
        client: redis::Client,
        tls: Option<redis_link::RedisTls>,
        timeouts: LaneTimeouts,
        preload_script: bool,
    ) -> Self {
        Lane {
            gate,
            client,
            tls,
            timeouts,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(ConnectState::default()),
            attempts: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            preload_script,
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(u64, PipelinedConnection)>> {
        self.current.lock().expect("the lane lock is never held across a panic")
    }

    pub(crate) async fn connection(&self) -> Result<(u64, PipelinedConnection), ConnectFailure> {
        if self.waiting.load(Ordering::Acquire) == 0 {
            if let Some(c) = self.slot().clone() {
                return Ok(c);
            }
        }
        // Declared before the lock guard: dropped after it, so a caller arriving between the two still queues.
        let _waiting = InFlightGuard::enter(&self.waiting);
        let seen = self.attempts.load(Ordering::Acquire);
        let mut state = self.connecting.lock().await;
        if let Some(c) = self.slot().clone() {
            return Ok(c);
        }
        if let Some(e) = state.last_error.as_ref().filter(|_| state.attempts != seen) {
            return Err(e.clone());
        }
        let result = PipelinedConnection::connect(
            self.client.get_connection_info(),
            self.tls.as_ref(),
            Some(self.timeouts.connect),
            Some(self.timeouts.response),
        )
        .await;
        state.attempts += 1;
        self.attempts.store(state.attempts, Ordering::Release);
        match result {
            Ok(con) => {
                if let Err(f) = self.gate.check(&con).await {
                    state.last_error = Some(f.clone());
                    return Err(f);
                }
                if self.preload_script {
                    let load = redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(PublishScript::source())
                        .query_async::<String>(&mut con.clone())
                        .await;
                    if let Err(e) = load {
                        let f = ConnectFailure::Redis(Arc::new(e));
                        state.last_error = Some(f.clone());
                        return Err(f);
                    }
                }
                state.last_error = None;
                let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                *self.slot() = Some((generation, con.clone()));
                Ok((generation, con))
            }
            Err(e) => {
                let f = ConnectFailure::Redis(Arc::new(e));
                state.last_error = Some(f.clone());
                Err(f)
            }
        }
    }

    pub(crate) fn discard(&self, generation: u64) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|(g, _)| *g == generation) {
            *slot = None;
        }
    }

    /// Runs a pipeline whose replies may individually be errors.
    pub(crate) async fn run(&self, pipe: &redis::Pipeline) -> Result<Vec<redis::RedisResult<Value>>, LaneError> {
        let (generation, mut con) = self.connection().await.map_err(LaneError::Connect)?;
        self.query(generation, &mut con, pipe).await.map_err(LaneError::Lost)
    }

    /// Runs a pipeline on this lane's connection of `generation`, its replies individually errors or not.
    pub(crate) async fn query(
        &self,
        generation: u64,
        con: &mut PipelinedConnection,
        pipe: &redis::Pipeline,
    ) -> Result<Vec<redis::RedisResult<Value>>, RedisError> {
        pipe.query_async::<Vec<redis::RedisResult<Value>>>(con)
            .await
            .inspect_err(|_| {
                // Whatever went wrong after the request was handed over, the connection is suspect: the next use
                // opens a fresh one.
                self.discard(generation);
            })
    }

    /// Runs `count` RESP-encoded commands, connecting first if needed; one reply each (see [`reply_of`]).
    pub(crate) async fn run_packed(
        &self,
        commands: Vec<bytes::Bytes>,
        count: usize,
    ) -> Result<Vec<redis::RedisResult<Value>>, LaneError> {
        let (generation, con) = self.connection().await.map_err(LaneError::Connect)?;
        match con.send_parts(commands, count).await {
            Ok(replies) => Ok(replies.into_iter().map(reply_of).collect()),
            Err(e) => {
                // As in `query`: after a failure the connection is suspect.
                self.discard(generation);
                Err(LaneError::Lost(e))
            }
        }
    }
}

/// Keeps the in-flight gauge right even when a publish future is dropped mid-flight.
pub(crate) struct InFlightGuard<'a>(&'a AtomicU64);

impl<'a> InFlightGuard<'a> {
    pub(crate) fn enter(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        InFlightGuard(gauge)
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What became of one command of a shard's pipeline.
pub(crate) enum CmdOutcome {
    /// Redis's reply (an error reply is a command that did not write).
    Reply(redis::RedisResult<Value>),
    /// Not sent: no connection.
    Connect(ConnectFailure),
    /// Sent, and the connection failed before the reply: unknown.
    Lost(Arc<RedisError>),
    /// On a cluster: redirected or told to retry until a bound was reached; not run.
    Unsettled(&'static str, Arc<RedisError>),
    /// A reply that does not fit the request (unknown).
    Unexpected(String),
}

/// One command's reply as redis-rs's pipelines give it: an error reply is `Err`; errors nested in an array (the
/// `XADD`s inside `EXEC`'s answer, each of which ran or not on its own) stay values.
pub(crate) fn reply_of(value: Value) -> redis::RedisResult<Value> {
    match value {
        Value::ServerError(e) => Err(e.into()),
        other => Ok(other),
    }
}

/// One outcome per command of a lane's pipeline of `count` commands.
pub(crate) fn cmd_outcomes(run: Result<Vec<redis::RedisResult<Value>>, LaneError>, count: usize) -> Vec<CmdOutcome> {
    match run {
        Ok(replies) => replies.into_iter().map(CmdOutcome::Reply).collect(),
        Err(LaneError::Connect(f)) => (0..count).map(|_| CmdOutcome::Connect(f.clone())).collect(),
        Err(LaneError::Lost(e)) => {
            let e = Arc::new(e);
            (0..count).map(|_| CmdOutcome::Lost(e.clone())).collect()
        }
    }
}
