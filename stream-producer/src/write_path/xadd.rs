//! The `XADD` of one record with the producer's trimming, the one definition of the command: written as RESP
//! straight into one buffer per pipeline ([`Xadd::encode`]; on the publish path a redis-rs `Cmd` per record was
//! most of the client's CPU per record, issue 17) or as a redis-rs command ([`Xadd::cmd`], for the cluster route,
//! which re-sends commands one by one). And what an `XADD`'s reply makes of its record.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use client_core::RedisFailure;
use protocol::{RoutingVersion, ShardId};
use redis::{RedisError, Value};
use redis_link::resp;

use crate::config::Trim;
use crate::error::PublishError;
use crate::lanes::{CmdOutcome, Replication};
use crate::publish_script::{self, ScriptTrim};
use crate::published::Published;
use crate::record::Record;

/// The trimming of the `XADD`s of one publish call.
#[derive(Debug, Clone)]
pub(crate) struct Xadd {
    trim: Option<Trim>,
    /// The `MINID` threshold of [`Trim::MaxAge`], taken when the publish call started.
    minid: Option<String>,
}

impl Xadd {
    /// The trimming `trim`, with its threshold as of now.
    pub(crate) fn now(trim: Option<Trim>) -> Self {
        let minid = match trim {
            Some(Trim::MaxAge(age)) => {
                // Entry ids are Redis's wall-clock milliseconds; the producer's clock is close enough for an
                // approximate retention bound.
                let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                Some(format!("{}-0", now.saturating_sub(age).as_millis()))
            }
            _ => None,
        };
        Xadd { trim, minid }
    }

    /// How many arguments the `XADD` of `record` has (the command name counts).
    fn arg_count(&self, record: &Record) -> usize {
        let trim = if self.trim.is_some() { 3 } else { 0 };
        3 + trim + 2 * record.fields().len()
    }

    /// The arguments of the `XADD` of one record, in order.
    fn args(&self, key: &str, record: &Record, mut arg: impl FnMut(&[u8])) {
        arg(b"XADD");
        arg(key.as_bytes());
        match self.trim {
            Some(Trim::MaxLen(n)) => {
                arg(b"MAXLEN");
                arg(b"~");
                arg(resp::Decimal::new(n).as_bytes());
            }
            Some(Trim::MaxAge(_)) => {
                arg(b"MINID");
                arg(b"~");
                arg(self.minid.as_deref().unwrap_or("0").as_bytes());
            }
            None => {}
        }
        arg(b"*");
        for (name, value) in record.fields() {
            arg(name);
            arg(value);
        }
    }

    /// The `XADD` of one record as a redis-rs command.
    pub(crate) fn cmd(&self, key: &str, record: &Record) -> redis::Cmd {
        // Sized up front: a command that grows while its arguments are added reallocates two buffers several
        // times per record.
        let field_bytes: usize = record.fields().iter().map(|(n, v)| n.len() + v.len()).sum();
        let mut cmd = redis::Cmd::with_capacity(self.arg_count(record), 64 + key.len() + field_bytes);
        self.args(key, record, |a| {
            cmd.arg(a);
        });
        cmd
    }

    /// The `XADD`s of `records` to `key`, as RESP in one buffer.
    pub(crate) fn encode<'r>(&self, key: &str, records: impl Iterator<Item = &'r Record> + Clone) -> bytes::Bytes {
        // Sized up front (an estimate that is exact for short arguments): one allocation per pipeline.
        let per_arg = resp::arg_len(0) + 2;
        let fixed = resp::arg_len(key.len()) + 6 * per_arg + 40 + self.minid.as_deref().map_or(0, str::len);
        let size: usize = records
            .clone()
            .map(|r| {
                let fields: usize = r.fields().iter().map(|(n, v)| n.len() + v.len() + 2 * per_arg).sum();
                fixed + fields
            })
            .sum();
        let mut buf = Vec::with_capacity(size);
        for record in records {
            resp::write_command(&mut buf, self.arg_count(record));
            self.args(key, record, |a| resp::write_arg(&mut buf, a));
        }
        buf.into()
    }

    /// The same trimming, as the publish script takes it.
    pub(crate) fn script_trim(&self) -> ScriptTrim<'_> {
        match (self.trim, self.minid.as_deref()) {
            (Some(Trim::MaxLen(n)), _) => ScriptTrim::MaxLen(n),
            (Some(Trim::MaxAge(_)), Some(id)) => ScriptTrim::MinId(id),
            _ => ScriptTrim::None,
        }
    }
}

/// The outcome of one `XADD` from its reply: an entry id, or Redis's refusal (a top-level error reply, or an
/// error inside `EXEC`'s answer).
pub(crate) fn xadd_outcome(
    shard: ShardId,
    routing_version: RoutingVersion,
    reply: redis::RedisResult<Value>,
) -> Result<Published, PublishError> {
    let rejected = |e: RedisError| PublishError::Rejected {
        shard,
        source: RedisFailure::from_redis_arc(Arc::new(e)),
    };
    match reply {
        Err(e) => Err(rejected(e)),
        Ok(Value::ServerError(e)) => Err(rejected(e.into())),
        Ok(value) => publish_script::entry_id(&value)
            .map(|id| Published {
                shard,
                id,
                routing_version,
                duplicate: false,
            })
            .ok_or_else(|| PublishError::UnexpectedReply {
                shard,
                detail: "the reply is not an entry id".into(),
            }),
    }
}

/// The results of a shard's `count` `XADD`s from their outcomes, Written only as far as `replication` confirms.
pub(crate) fn settle(
    shard: ShardId,
    outcomes: Vec<CmdOutcome>,
    count: usize,
    routing_version: RoutingVersion,
    replication: &Replication,
) -> Vec<Result<Published, PublishError>> {
    let results: Vec<Result<Published, PublishError>> = if outcomes.len() == count {
        outcomes
            .into_iter()
            .map(|outcome| match outcome {
                CmdOutcome::Reply(reply) => xadd_outcome(shard, routing_version, reply),
                CmdOutcome::Connect(f) => Err(f.into_publish_error(shard)),
                CmdOutcome::Lost(source) => Err(PublishError::ConnectionLost {
                    shard,
                    source: RedisFailure::from_redis_arc(source),
                }),
                CmdOutcome::Unsettled(reason, source) => Err(PublishError::ClusterUnsettled {
                    shard,
                    reason,
                    source: RedisFailure::from_redis_arc(source),
                }),
                CmdOutcome::Unexpected(detail) => Err(PublishError::UnexpectedReply { shard, detail }),
            })
            .collect()
    } else {
        let err = PublishError::UnexpectedReply {
            shard,
            detail: format!("{} replies to {count} XADDs", outcomes.len()),
        };
        vec![Err(err); count]
    };
    replication.apply(results)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn xadd_carries_approximate_maxlen() {
        let xadd = Xadd::now(Some(Trim::MaxLen(1000)));
        let mut pipe = redis::pipe();
        pipe.add_command(xadd.cmd("k", &Record::with_key("a").field("f", "v")));
        let packed = String::from_utf8_lossy(&pipe.get_packed_pipeline()).to_string();
        let words: Vec<&str> = packed
            .split("\r\n")
            .filter(|w| !(w.starts_with('$') || (w.starts_with('*') && w.len() > 1)))
            .collect();
        assert_eq!(words, ["XADD", "k", "MAXLEN", "~", "1000", "*", "f", "v", ""]);
    }

    #[test]
    fn the_resp_written_xadds_are_the_commands_redis_rs_would_send() {
        let records = [
            Record::with_key("a").field("f", "v"),
            Record::without_key()
                .field("", "")
                .field(vec![0u8, 13, 10], "x".repeat(300)),
        ];
        for trim in [
            None,
            Some(Trim::MaxLen(1000)),
            Some(Trim::MaxAge(Duration::from_secs(60))),
        ] {
            let xadd = Xadd::now(trim);
            let mut pipe = redis::pipe();
            for r in &records {
                pipe.add_command(xadd.cmd("s:{orders}:3", r));
            }
            let encoded = xadd.encode("s:{orders}:3", records.iter());
            assert_eq!(&encoded[..], &pipe.get_packed_pipeline()[..], "{trim:?}");
        }
    }
}
