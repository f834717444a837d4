//! The fenced publish on one server as a checked transaction (issue 17): per batch of a shard,
//!
//! 1. `UNWATCH`, `WATCH <fence>`, `HGET <fence> routingVersion`, `MULTI` (one round trip); the producer compares
//!    the fence with its routing version;
//! 2. only when the fence is not above it: the batch's `XADD`s and `EXEC` (the second round trip, on the same
//!    connection); when it is: `DISCARD`, and the batch fails as [`PublishError::Fenced`], not written.
//!
//! # Why this is as safe as the publish script
//! * `WATCH` makes `EXEC` answer nil when the fence key was modified after it: a seal (which raises the fence,
//!   `HSET`) between the check and the writes aborts the whole batch, nothing of it written. The check is then
//!   taken again, and reports the new fence.
//! * The `XADD`s leave only after the producer read a fence it accepts and `MULTI` was acknowledged: any failure
//!   of the first round trip (an error reply to any of its commands, a lost connection, a fence that is not a
//!   number) stops the batch before a single `XADD` is sent. Fail closed by construction. (A design that sends
//!   the writes in the same pipeline as a script that *dirties* the watched key when fenced would need no second
//!   round trip, but would write unchecked whenever the script did not run: `NOSCRIPT`, `BUSY`, an ACL without
//!   `EVAL`.)
//! * The lane is held exclusively for both round trips ([`Exclusive`]): `WATCH` and `MULTI` are state of the
//!   connection, and another pipeline on it would run inside our transaction or clear our watch. Both round trips
//!   use the same connection; if the holder is dropped between them (cancellation) or the connection fails, the
//!   connection is discarded, so its state dies with it.
//! * `EXEC` runs the queued `XADD`s with nothing in between; they address one key, so a key of the wrong type
//!   fails them all, and an error while queueing (out of memory) aborts the transaction. A batch is written
//!   whole or not at all, like a script call.
//!
//! # Cost
//! Redis spends 11,041 instructions per record on this (`scripts/script-cost.sh`, variant `watch`, 128 records
//! per batch), 0.908 of plain pipelined `XADD`s, against 14,515 (0.691) for the publish script: its per-record
//! Lua work (every argument interned as a Lua string, a `redis.call` per record) is gone. The client pays a
//! second round trip per batch and each lane carries one batch at a time.
//!
//! Used for the fenced producer without idempotence on one server. The idempotent producer keeps the script (its
//! sequence check and the remembered ids must change atomically with the write), and so does a Redis Cluster
//! (a redirect there answers command by command, and a transaction cannot be followed that way).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use protocol::keys::{self, shard_fence_fields};
use protocol::{RoutingVersion, ShardId};
use redis::aio::MultiplexedConnection;
use redis::{RedisError, RedisResult, Value};

use super::{ConnectFailure, InFlightGuard, Lane, Published, Publisher, Record};
use crate::error::PublishError;
use crate::publish_script::{entry_id, MAX_RECORDS_PER_CALL};

/// Checks of one batch whose `EXEC` was aborted by a change of the fence that still let the producer write
/// (the key was touched, not raised above its version). More fails the batch as not written.
const MAX_ATTEMPTS: u32 = 3;

/// A lane's connection held by one caller: nothing else is sent on it until this drops.
pub(super) struct Exclusive<'a> {
    lane: &'a Lane,
    _turn: tokio::sync::MutexGuard<'a, ()>,
    generation: u64,
    con: MultiplexedConnection,
    /// The connection may be inside `MULTI`: dropping the holder now discards the connection.
    open_transaction: bool,
}

impl Lane {
    /// Waits for the lane's turn (first come, first served: the batches of one shard keep their order) and its
    /// connection.
    pub(super) async fn exclusive(&self) -> Result<Exclusive<'_>, ConnectFailure> {
        let turn = self.exclusive.lock().await;
        let (generation, con) = self.connection().await?;
        Ok(Exclusive {
            lane: self,
            _turn: turn,
            generation,
            con,
            open_transaction: false,
        })
    }
}

impl Exclusive<'_> {
    /// Runs a pipeline whose replies may individually be errors; a transport error discards the connection.
    async fn run(&mut self, pipe: &redis::Pipeline) -> Result<Vec<RedisResult<Value>>, RedisError> {
        match pipe.query_async::<Vec<RedisResult<Value>>>(&mut self.con).await {
            Ok(replies) => Ok(replies),
            Err(e) => {
                self.lane.discard(self.generation);
                Err(e)
            }
        }
    }

    /// Leaves the transaction opened by a check: `DISCARD`, or the connection goes.
    async fn discard_transaction(&mut self) {
        let mut pipe = redis::pipe();
        pipe.cmd("DISCARD");
        if self.run(&pipe).await.is_ok_and(|r| matches!(r.first(), Some(Ok(_)))) {
            self.open_transaction = false;
        }
    }
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        if self.open_transaction {
            self.lane.discard(self.generation);
        }
    }
}

/// Why the batches of a shard stopped before every one was sent. The batches after it are not sent.
enum Stop {
    /// The connection failed before the batch's writes left: not written.
    NotSent(Arc<RedisError>),
    /// The connection failed after the writes left: unknown.
    Lost(Arc<RedisError>),
    /// A command of the check was refused (or answered out of shape): not written, and the connection, whose
    /// state is now unclear, is not used again.
    Refused(Arc<RedisError>),
}

impl Stop {
    fn source(&self) -> &Arc<RedisError> {
        match self {
            Stop::NotSent(e) | Stop::Lost(e) | Stop::Refused(e) => e,
        }
    }

    /// The error of the batch that stopped.
    fn error(&self, shard: ShardId) -> PublishError {
        let source = self.source().clone();
        match self {
            Stop::NotSent(_) => PublishError::NotSent { shard, source },
            Stop::Lost(_) => PublishError::ConnectionLost { shard, source },
            Stop::Refused(_) => PublishError::Rejected { shard, source },
        }
    }
}

impl Publisher {
    /// Publishes one shard's records as checked transactions of at most [`MAX_RECORDS_PER_CALL`] records, one
    /// after another on the shard's lane, held for all of them.
    pub(super) async fn run_transactions(
        &self,
        shard: ShardId,
        records: &[&Record],
        routing_version: RoutingVersion,
        minid: Option<&str>,
    ) -> Vec<Result<Published, PublishError>> {
        let lane = &self.lanes[shard.index() % self.lanes.len()];
        let mut out: Vec<Result<Published, PublishError>> = Vec::with_capacity(records.len());
        match lane.exclusive().await {
            Err(f) => out.extend((0..records.len()).map(|_| Err(f.clone().into_publish_error(shard)))),
            Ok(mut hold) => {
                let stream_key = keys::shard_stream(&self.stream, shard);
                let fence_key = keys::shard_fence(&self.stream, shard);
                let mut stop: Option<Stop> = None;
                for batch in records.chunks(MAX_RECORDS_PER_CALL) {
                    if let Some(stop) = &stop {
                        let source = stop.source();
                        out.extend(batch.iter().map(|_| {
                            Err(PublishError::NotSent {
                                shard,
                                source: source.clone(),
                            })
                        }));
                        continue;
                    }
                    let txn = Txn {
                        shard,
                        stream_key: &stream_key,
                        fence_key: &fence_key,
                        routing_version,
                        minid,
                    };
                    match self.transaction(&mut hold, &txn, batch).await {
                        Ok(results) => out.extend(results),
                        Err(s) => {
                            out.extend(batch.iter().map(|_| Err(s.error(shard))));
                            stop = Some(s);
                        }
                    }
                }
            }
        }
        self.count(&out);
        out
    }

    /// One batch: checked, then written or refused. `Err` when the connection failed.
    async fn transaction(
        &self,
        hold: &mut Exclusive<'_>,
        txn: &Txn<'_>,
        batch: &[&Record],
    ) -> Result<Vec<Result<Published, PublishError>>, Stop> {
        let shard = txn.shard;
        let all = |e: PublishError| -> Vec<Result<Published, PublishError>> { vec![Err(e); batch.len()] };
        let rejected = |source: RedisError| PublishError::Rejected {
            shard,
            source: Arc::new(source),
        };
        let mut check = redis::pipe();
        check.ignore_errors();
        check
            .cmd("UNWATCH")
            .cmd("WATCH")
            .arg(txn.fence_key)
            .cmd("HGET")
            .arg(txn.fence_key)
            .arg(shard_fence_fields::ROUTING_VERSION)
            .cmd("MULTI");
        for _attempt in 0..MAX_ATTEMPTS {
            self.stats.pipelines.fetch_add(1, Ordering::Relaxed);
            let _in_flight = InFlightGuard::enter(&self.stats.pipelines_in_flight);
            // From here until EXEC or DISCARD is answered the connection may be inside MULTI.
            hold.open_transaction = true;
            let replies = hold.run(&check).await.map_err(|e| Stop::NotSent(Arc::new(e)))?;
            let fence = match check_reply(replies) {
                Ok(fence) => fence,
                Err(e) => {
                    // Whether MULTI was taken or not, nothing more goes on this connection.
                    hold.lane.discard(hold.generation);
                    hold.open_transaction = false;
                    return Err(Stop::Refused(Arc::new(e)));
                }
            };
            let fence = match fence {
                Fence::Value(v) => v,
                Fence::Unreadable(e) => {
                    hold.discard_transaction().await;
                    return Ok(all(rejected(e)));
                }
            };
            if txn.routing_version < fence {
                hold.discard_transaction().await;
                return Ok(all(PublishError::Fenced {
                    shard,
                    routing_version: txn.routing_version,
                    fence,
                }));
            }
            let mut writes = redis::Pipeline::with_capacity(batch.len() + 1);
            writes.ignore_errors();
            for record in batch {
                self.add_xadd(&mut writes, txn.stream_key, record, txn.minid);
            }
            writes.cmd("EXEC");
            let mut replies = hold.run(&writes).await.map_err(|e| Stop::Lost(Arc::new(e)))?;
            hold.open_transaction = false;
            if replies.len() != batch.len() + 1 {
                return Ok(all(PublishError::UnexpectedReply {
                    shard,
                    detail: format!("{} replies to {} queued XADDs and EXEC", replies.len(), batch.len()),
                }));
            }
            let exec = replies.pop().expect("checked the length");
            return Ok(match exec {
                // The fence was touched after WATCH: nothing written. Check again.
                Ok(Value::Nil) => continue,
                Ok(Value::Array(items)) if items.len() == batch.len() => items
                    .into_iter()
                    .map(|item| match item {
                        Value::ServerError(e) => Err(rejected(RedisError::from(e))),
                        value => entry_id(&value)
                            .map(|id| Published {
                                shard,
                                id,
                                routing_version: txn.routing_version,
                                duplicate: false,
                            })
                            .ok_or_else(|| PublishError::UnexpectedReply {
                                shard,
                                detail: "an XADD reply in EXEC is not an entry id".into(),
                            }),
                    })
                    .collect(),
                Ok(other) => all(PublishError::UnexpectedReply {
                    shard,
                    detail: format!("EXEC answered {other:?}"),
                }),
                // EXECABORT (an XADD was refused while queued, e.g. out of memory) or EXEC itself refused: the
                // first queued refusal says why.
                Err(exec_error) => {
                    let cause = replies.into_iter().find_map(Result::err).unwrap_or(exec_error);
                    all(rejected(cause))
                }
            });
        }
        Ok(all(rejected(RedisError::from((
            redis::ErrorKind::Client,
            "the shard's fence changed during every attempt",
            format!("{MAX_ATTEMPTS} transactions aborted by WATCH"),
        )))))
    }
}

/// What one checked transaction writes.
struct Txn<'a> {
    shard: ShardId,
    stream_key: &'a str,
    fence_key: &'a str,
    routing_version: RoutingVersion,
    minid: Option<&'a str>,
}

/// The fence as the check read it.
#[derive(Debug)]
enum Fence {
    Value(RoutingVersion),
    /// The fence holds something that is not a routing version: refused, fail closed.
    Unreadable(RedisError),
}

/// Reads the replies of `UNWATCH`, `WATCH`, `HGET`, `MULTI`. `Err`: a command was refused or the replies do not fit
/// (the transaction must not go on, on this connection).
fn check_reply(replies: Vec<RedisResult<Value>>) -> Result<Fence, RedisError> {
    let unexpected = |detail: String| RedisError::from((redis::ErrorKind::UnexpectedReturnType, "fence check", detail));
    let [unwatch, watch, hget, multi]: [RedisResult<Value>; 4] = replies
        .try_into()
        .map_err(|r: Vec<_>| unexpected(format!("{} replies to 4 commands", r.len())))?;
    unwatch?;
    watch?;
    let fence = hget?;
    multi?;
    Ok(match fence {
        Value::Nil => Fence::Value(RoutingVersion(0)),
        Value::BulkString(bytes) => match parse_fence(&bytes) {
            Some(v) => Fence::Value(v),
            None => Fence::Unreadable(RedisError::from((
                redis::ErrorKind::Parse,
                "CORRUPT fence",
                format!("holds {:?}", String::from_utf8_lossy(&bytes[..bytes.len().min(40)])),
            ))),
        },
        other => return Err(unexpected(format!("HGET answered {other:?}"))),
    })
}

/// A fence value as the coordinator's seal writes it: decimal digits, at most 15 (the seal script's own bound).
fn parse_fence(bytes: &[u8]) -> Option<RoutingVersion> {
    if bytes.is_empty() || bytes.len() > 15 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok().map(RoutingVersion)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(v: Value) -> RedisResult<Value> {
        Ok(v)
    }

    fn status() -> RedisResult<Value> {
        ok(Value::Okay)
    }

    #[test]
    fn fence_values_are_decimal_digits_only() {
        assert_eq!(parse_fence(b"0"), Some(RoutingVersion(0)));
        assert_eq!(parse_fence(b"42"), Some(RoutingVersion(42)));
        assert_eq!(
            parse_fence(b"999999999999999"),
            Some(RoutingVersion(999_999_999_999_999))
        );
        for bad in [&b""[..], b"-1", b"1.5", b" 1", b"1e3", b"abc", b"1000000000000000"] {
            assert_eq!(parse_fence(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn the_check_reads_an_absent_fence_as_zero_and_a_set_one_as_its_value() {
        let absent = check_reply(vec![status(), status(), ok(Value::Nil), status()]).unwrap();
        assert!(matches!(absent, Fence::Value(RoutingVersion(0))));
        let set = check_reply(vec![status(), status(), ok(Value::BulkString(b"7".to_vec())), status()]).unwrap();
        assert!(matches!(set, Fence::Value(RoutingVersion(7))));
        let corrupt = check_reply(vec![status(), status(), ok(Value::BulkString(b"x".to_vec())), status()]).unwrap();
        assert!(matches!(corrupt, Fence::Unreadable(_)));
    }

    #[test]
    fn any_refused_command_of_the_check_stops_the_batch() {
        let refused = || -> RedisResult<Value> { Err(RedisError::from((redis::ErrorKind::Client, "refused"))) };
        let seven = || ok(Value::BulkString(b"7".to_vec()));
        for replies in [
            vec![refused(), status(), seven(), status()],
            vec![status(), refused(), seven(), status()],
            vec![status(), status(), refused(), status()],
            vec![status(), status(), seven(), refused()],
            vec![status(), status(), seven()],
            vec![status(), status(), ok(Value::Int(7)), status()],
        ] {
            assert!(check_reply(replies).is_err());
        }
    }
}
