//! Durable writes (issue 30): with [`Durability::Replicas`] every write of the producer is followed by
//! `WAIT <min> <timeout ms>` on the connection that carried it, in the same request, and its records are Written
//! only when that `WAIT` answers at least `min`.
//!
//! # Where the `WAIT` goes
//! `WAIT` counts the replicas that acknowledged every write *its own connection* made before it (Redis keeps the
//! replication offset of each client's last write), so it must follow the writes on their connection; on another
//! connection it would wait for nothing. Pipelined right behind them, it costs no extra round trip:
//! * plain `XADD`s: behind the shard's pipeline ([`ServerLanes::send_packed`](super::server::ServerLanes::send_packed));
//! * the checked transaction: behind `EXEC`, before the next turn's check (`write_path/fenced.rs`); the `XADD`s of every
//!   batch of the transaction are in one `EXEC`, so one `WAIT` covers them all;
//! * the publish script (idempotent producer, Redis Cluster): behind the script calls of the shard's pipeline
//!   ([`ServerLanes::send`](super::server::ServerLanes::send)), and behind the calls sent again after `SCRIPT LOAD`;
//! * Redis Cluster: behind every request the route sends for a shard's pipeline, on the node that takes it
//!   (`cluster.rs`). Commands redirected to another node are followed there by a `WAIT` of their own. A
//!   pipeline's records are Written only when the `WAIT` of every request that ran some of them confirmed: a
//!   record confirmed by one request's `WAIT` may be reported Unknown because another request's fell short
//!   (conservative; only redirected pipelines send more than one request).
//!
//! # What the answer means
//! * `WAIT` answers at least `min`: the records written by the request are Written.
//! * Fewer (the replicas lag more than the timeout, are stopped, or there are none): the records the master wrote
//!   become [`PublishError::NotReplicated`], [`Unknown`](crate::error::WriteState::Unknown). Records the request did not
//!   write (fenced, refused, a duplicate of nothing) keep their outcome: nothing of them can be lost.
//! * `WAIT` refused (an ACL without it) or answered something else: as fewer, with the error as the source.
//! * The idempotent producer's duplicate answer (a retry of a call that was written, perhaps on a connection that
//!   has since died) renews the expiry of the producer's state key, a write, so the `WAIT` behind it covers the
//!   original write as well: Written then means the original records are on `min` replicas.
//!
//! `WAIT` blocks its connection until it answers: requests queued behind it on the same connection wait too. The
//! producer's first connection to a server also checks that `WAIT` exists ([`WAIT_REQUIREMENTS`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use client_core::redis_check::MIN_REDIS_VERSION;
use client_core::{RedisFailure, RedisRequirements};
use redis::{RedisError, RedisResult, Value};

use super::gate::ConnectFailure;
use super::lane::CmdOutcome;
use crate::config::{Durability, ProducerConfig};
use crate::error::PublishError;
use crate::published::Published;

/// What a durable producer needs from its Redis beyond [`REDIS_REQUIREMENTS`](super::gate::REDIS_REQUIREMENTS).
pub(crate) const WAIT_REQUIREMENTS: RedisRequirements = RedisRequirements {
    min_version: MIN_REDIS_VERSION,
    commands: &[("WAIT", "durable writes (waiting for replicas)")],
};

/// The `WAIT` every write request of a durable producer ends with.
#[derive(Debug)]
pub(crate) struct Durable {
    /// Replicas that must confirm.
    min: u32,
    /// `WAIT`'s timeout, in whole milliseconds (at least 1: 0 would block forever).
    timeout_ms: u64,
    /// `WAIT <min> <timeout_ms>` as RESP, appended to requests without a copy.
    packed: Bytes,
}

impl Durable {
    /// The `WAIT` of a producer with these settings; `None` when Written means the master's acknowledgement alone.
    pub(crate) fn of(config: &ProducerConfig) -> Option<Durable> {
        match config.durability {
            Durability::Replicas { min, timeout } => Some(Durable::new(min, timeout)),
            Durability::Primary => None,
        }
    }

    pub(crate) fn new(min: u32, timeout: Duration) -> Self {
        let timeout_ms = u64::try_from(timeout.as_nanos().div_ceil(1_000_000))
            .unwrap_or(u64::MAX)
            .max(1);
        let mut durable = Durable {
            min,
            timeout_ms,
            packed: Bytes::new(),
        };
        durable.packed = Bytes::from(durable.command().get_packed_command());
        durable
    }

    /// `WAIT` as a redis-rs command (for the cluster route's requests after a redirect).
    pub(crate) fn command(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.min).arg(self.timeout_ms);
        cmd
    }

    /// `WAIT` as RESP.
    pub(crate) fn packed(&self) -> Bytes {
        self.packed.clone()
    }

    /// What one `WAIT`'s reply says.
    pub(crate) fn read(&self, reply: RedisResult<Value>) -> Replication {
        match reply {
            Ok(Value::Int(n)) if n >= i64::from(self.min) => Replication::Confirmed,
            Ok(Value::Int(n)) => Replication::Short {
                acked: u32::try_from(n).unwrap_or(0),
                required: self.min,
                source: None,
            },
            Ok(other) => self.failed(Arc::new(unexpected(format!("WAIT answered {other:?}, not a count")))),
            Err(e) => self.failed(Arc::new(e)),
        }
    }

    /// A `WAIT` that answered no count.
    fn failed(&self, source: Arc<RedisError>) -> Replication {
        Replication::Short {
            acked: 0,
            required: self.min,
            source: Some(source),
        }
    }

    /// What a `WAIT` that may not have been answered says.
    pub(crate) fn read_outcome(&self, outcome: Option<CmdOutcome>) -> Replication {
        match outcome {
            Some(CmdOutcome::Reply(reply)) => self.read(reply),
            Some(CmdOutcome::Lost(e) | CmdOutcome::Unsettled(_, e) | CmdOutcome::Connect(ConnectFailure::Redis(e))) => {
                self.failed(e)
            }
            Some(CmdOutcome::Connect(ConnectFailure::Unsupported(e))) => self.failed(Arc::new(RedisError::from((
                redis::ErrorKind::Client,
                "Redis cannot serve the producer",
                e.to_string(),
            )))),
            Some(CmdOutcome::Unexpected(detail)) => self.failed(Arc::new(unexpected(detail))),
            None => self.failed(Arc::new(unexpected("no reply to WAIT".into()))),
        }
    }

    /// Takes `WAIT`'s outcome off the end of the outcomes of `count` commands and the `WAIT`. Outcomes of another
    /// length are left as they are (their reader reports them as unexpected) and count as not confirmed.
    pub(crate) fn split(&self, outcomes: &mut Vec<CmdOutcome>, count: usize) -> Replication {
        if outcomes.len() == count + 1 {
            self.read_outcome(outcomes.pop())
        } else {
            self.read_outcome(Some(CmdOutcome::Unexpected(format!(
                "{} replies to {count} commands and WAIT",
                outcomes.len()
            ))))
        }
    }
}

fn unexpected(detail: String) -> RedisError {
    RedisError::from((redis::ErrorKind::UnexpectedReturnType, "durable write", detail))
}

/// What the `WAIT`s behind a request's writes confirmed.
#[derive(Debug, Clone)]
pub(crate) enum Replication {
    /// Enough replicas confirmed, or the producer is not durable (nothing to confirm).
    Confirmed,
    /// Fewer than `required` confirmed (`source`: the `WAIT` got no count back).
    Short {
        acked: u32,
        required: u32,
        source: Option<Arc<RedisError>>,
    },
}

impl Replication {
    /// The records of `results` the master wrote, as Written only when the replicas confirmed them; every other
    /// result as it is.
    pub(crate) fn apply(&self, results: Vec<Result<Published, PublishError>>) -> Vec<Result<Published, PublishError>> {
        let Replication::Short {
            acked,
            required,
            source,
        } = self
        else {
            return results;
        };
        results
            .into_iter()
            .map(|r| {
                r.and_then(|p| {
                    Err(PublishError::NotReplicated {
                        shard: p.shard,
                        acked: *acked,
                        required: *required,
                        source: source.clone().map(RedisFailure::from_redis_arc),
                    })
                })
            })
            .collect()
    }

    /// The weaker of two confirmations (the requests of one redirected cluster pipeline).
    pub(crate) fn and(self, other: Replication) -> Replication {
        match (self, other) {
            (Replication::Confirmed, weaker) | (weaker, Replication::Confirmed) => weaker,
            (a @ Replication::Short { acked: x, .. }, b @ Replication::Short { acked: y, .. }) => {
                if y < x {
                    b
                } else {
                    a
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::{EntryId, RoutingVersion, ShardId};

    fn written(shard: u32) -> Result<Published, PublishError> {
        Ok(Published {
            shard: ShardId(shard),
            id: EntryId { ms: 1, seq: 0 },
            routing_version: RoutingVersion(1),
            duplicate: false,
        })
    }

    #[test]
    fn wait_is_packed_with_whole_milliseconds_rounded_up() {
        let words = |d: &Durable| String::from_utf8(d.packed().to_vec()).unwrap();
        assert_eq!(
            words(&Durable::new(2, Duration::from_millis(250))),
            "*3\r\n$4\r\nWAIT\r\n$1\r\n2\r\n$3\r\n250\r\n"
        );
        assert!(words(&Durable::new(1, Duration::from_micros(1500))).ends_with("$1\r\n2\r\n"));
        assert!(
            words(&Durable::new(1, Duration::from_nanos(1))).ends_with("$1\r\n1\r\n"),
            "never 0 (forever)"
        );
        let d = Durable::new(3, Duration::from_secs(1));
        assert_eq!(d.packed().to_vec(), d.command().get_packed_command());
    }

    #[test]
    fn enough_replicas_confirm_fewer_do_not() {
        let d = Durable::new(2, Duration::from_millis(100));
        assert!(matches!(d.read(Ok(Value::Int(2))), Replication::Confirmed));
        assert!(matches!(d.read(Ok(Value::Int(3))), Replication::Confirmed));
        assert!(matches!(
            d.read(Ok(Value::Int(1))),
            Replication::Short {
                acked: 1,
                required: 2,
                source: None
            }
        ));
        let refused = RedisError::from((redis::ErrorKind::Client, "NOPERM"));
        assert!(matches!(
            d.read(Err(refused)),
            Replication::Short {
                acked: 0,
                source: Some(_),
                ..
            }
        ));
        assert!(matches!(
            d.read(Ok(Value::Okay)),
            Replication::Short { source: Some(_), .. }
        ));
        assert!(matches!(
            d.read_outcome(None),
            Replication::Short { source: Some(_), .. }
        ));
    }

    #[test]
    fn a_short_wait_turns_written_records_unknown_and_leaves_the_others() {
        let refused = Err(PublishError::InvalidRecord("x"));
        let short = Replication::Short {
            acked: 0,
            required: 1,
            source: None,
        };
        let out = short.apply(vec![written(3), refused.clone(), written(3)]);
        assert!(matches!(
            out[0],
            Err(PublishError::NotReplicated {
                shard: ShardId(3),
                acked: 0,
                required: 1,
                ..
            })
        ));
        assert_eq!(
            out[0].as_ref().unwrap_err().write_state(),
            crate::error::WriteState::Unknown
        );
        assert!(matches!(out[1], Err(PublishError::InvalidRecord(_))));
        assert!(out[2].as_ref().unwrap_err().is_not_replicated());
        let confirmed = Replication::Confirmed.apply(vec![written(1), refused]);
        assert!(confirmed[0].is_ok() && confirmed[1].is_err());
    }

    #[test]
    fn the_weaker_confirmation_wins() {
        let short = |acked| Replication::Short {
            acked,
            required: 2,
            source: None,
        };
        assert!(matches!(
            Replication::Confirmed.and(Replication::Confirmed),
            Replication::Confirmed
        ));
        assert!(matches!(
            Replication::Confirmed.and(short(1)),
            Replication::Short { acked: 1, .. }
        ));
        assert!(matches!(
            short(1).and(Replication::Confirmed),
            Replication::Short { acked: 1, .. }
        ));
        assert!(matches!(short(1).and(short(0)), Replication::Short { acked: 0, .. }));
        assert!(matches!(short(0).and(short(1)), Replication::Short { acked: 0, .. }));
    }
}
