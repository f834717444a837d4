//! The scripted path: one `EVALSHA` of the publish script ([`crate::publish_script`]) per call of at most
//! [`MAX_RECORDS_PER_CALL`] records, written whole or not at all after the shard's fence accepted it. Taken by the
//! idempotent producer (on one server or a cluster) and by the fenced producer on a Redis Cluster, where a checked
//! transaction cannot follow redirects command by command.
//!
//! The calls of one shard go in one pipeline, as `XADD`s do. Calls answered `NOSCRIPT` (a restarted or failed-over
//! Redis: nothing executed) are sent again once, after `SCRIPT LOAD`.
//!
//! # Idempotent producer
//! With idempotence on (`ProducerBuilder::idempotence`) every call carries the producer id, the instance's
//! epoch and the sequence number of its first record; the producer sends at most one call per shard at a time
//! (a per-shard async lock) and retries a call whose outcome is unknown with the same numbers, so the script
//! recognises a retry of a call it already wrote and answers with the original ids. Sequence numbers advance
//! only when a call was written (or its outcome stayed unknown after every retry: the next call then says a
//! gap is expected); a call refused as not written leaves them for the next call.

use std::sync::Arc;
use std::time::Duration;

use client_core::RedisFailure;
use protocol::names::StreamName;
use protocol::{EntryId, RoutingVersion, ShardId};
use redis::RedisError;

use super::batch::ShardBatch;
use super::idempotence::{Idempotence, ShardSequence};
use crate::config::{ProducerConfig, IDEMPOTENT_RETRY_MAX};
use crate::error::PublishError;
use crate::lanes::{CmdOutcome, ConnectFailure, Replication, Route};
use crate::publish_script::{
    args_of, parse_reply, Call, PublishScript, ScriptReply, Sequence, MAX_ARGS_PER_CALL, MAX_FIELDS_PER_RECORD,
    MAX_RECORDS_PER_CALL,
};
use crate::published::Published;
use crate::record::Record;

/// The publish script, optionally idempotent, over one server's lanes or a cluster.
pub(crate) struct Scripted {
    stream: StreamName,
    route: Route,
    script: PublishScript,
    idempotence: Option<Idempotence>,
}

/// One script call: its records and, when idempotent, its sequence.
struct CallSpec<'a> {
    records: &'a [&'a Record],
    sequence: Option<Sequence<'a>>,
}

/// What one script call came to.
enum CallOutcome {
    Reply(ScriptReply),
    /// An error reply (nothing executed, or the script refused before writing).
    Rejected(Arc<RedisError>),
    Connect(ConnectFailure),
    Lost(Arc<RedisError>),
    /// On a cluster: not run, the slot did not settle in time.
    Unsettled(&'static str, Arc<RedisError>),
    Unexpected(String),
}

impl Scripted {
    /// The path over `route`, whose connections load the script; idempotent when `config` asks for it.
    pub(crate) fn new(config: &ProducerConfig, route: Route) -> Self {
        Scripted {
            stream: config.stream.clone(),
            route,
            script: PublishScript::default(),
            idempotence: config.idempotence.as_ref().map(Idempotence::new),
        }
    }

    /// Where it sends.
    pub(crate) fn route(&self) -> &Route {
        &self.route
    }

    /// The idempotent producer's id, when idempotent.
    pub(crate) fn producer_id(&self) -> Option<&str> {
        self.idempotence.as_ref().map(|i| i.producer_id.as_str())
    }

    /// Publishes one shard's records through the script: split into calls of at most [`MAX_RECORDS_PER_CALL`]
    /// records, all in one pipeline, or one call at a time under the shard's sequence lock when idempotent.
    pub(crate) async fn write(&self, batch: &ShardBatch<'_>) -> Vec<Result<Published, PublishError>> {
        let (shard, records) = (batch.shard, batch.records);
        let mut out: Vec<Option<Result<Published, PublishError>>> = vec![None; records.len()];
        let mut calls: Vec<Vec<usize>> = Vec::new();
        let mut args = 0;
        for (i, r) in records.iter().enumerate() {
            if r.fields().len() > MAX_FIELDS_PER_RECORD {
                out[i] = Some(Err(PublishError::InvalidRecord(
                    "a record published through the fenced script has at most 1000 fields",
                )));
                continue;
            }
            let full = calls
                .last()
                .is_none_or(|c| c.len() >= MAX_RECORDS_PER_CALL || args + args_of(r) > MAX_ARGS_PER_CALL);
            if full {
                calls.push(Vec::new());
                args = 0;
            }
            args += args_of(r);
            calls.last_mut().expect("pushed above").push(i);
        }
        let call = Call {
            shard,
            presented: batch.presented,
            trim: batch.xadd.script_trim(),
            sequence: None,
        };
        let call_records: Vec<Vec<&Record>> = calls.iter().map(|c| c.iter().map(|&i| records[i]).collect()).collect();
        match &self.idempotence {
            None => {
                let specs: Vec<CallSpec<'_>> = call_records
                    .iter()
                    .map(|r| CallSpec {
                        records: r,
                        sequence: None,
                    })
                    .collect();
                let outcomes = self.calls(call, &specs).await;
                for ((indices, (outcome, replication)), spec) in calls.iter().zip(outcomes).zip(&specs) {
                    let results = replication.apply(results(call, spec, outcome));
                    for (&i, r) in indices.iter().zip(results) {
                        out[i] = Some(r);
                    }
                }
            }
            Some(idem) => {
                let lock = idem.shard(shard);
                let mut sequence = lock.lock().await;
                for (indices, recs) in calls.iter().zip(&call_records) {
                    let results = self.call_idempotent(idem, &mut sequence, call, recs).await;
                    for (&i, r) in indices.iter().zip(results) {
                        out[i] = Some(r);
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.expect("every record is in one call or refused"))
            .collect()
    }

    /// One idempotent call, retried with the same sequence numbers while its outcome is unknown.
    async fn call_idempotent(
        &self,
        idem: &Idempotence,
        sequence: &mut ShardSequence,
        call: Call<'_>,
        records: &[&Record],
    ) -> Vec<Result<Published, PublishError>> {
        let first = sequence.next;
        let count = records.len() as u64;
        // Set once an attempt may have been executed: from then on only the script's answer settles the call.
        let mut lost: Option<Arc<RedisError>> = None;
        let mut attempt = 0u32;
        loop {
            let spec = CallSpec {
                records,
                sequence: Some(Sequence {
                    producer_id: &idem.producer_id,
                    epoch: &idem.epoch,
                    first,
                    gap: sequence.gap,
                    idle_ms: idem.idle_ms,
                }),
            };
            let (outcome, replication) = self
                .calls(call, std::slice::from_ref(&spec))
                .await
                .pop()
                .expect("one outcome per call");
            let retry = after_attempt(sequence, first, count, &outcome, &mut lost);
            if retry && attempt < idem.max_retries {
                attempt += 1;
                let backoff = Duration::from_millis(10u64 << attempt.min(6)).min(IDEMPOTENT_RETRY_MAX);
                tokio::time::sleep(backoff).await;
                continue;
            }
            if let Some(source) = lost.filter(|_| retry) {
                // Every retry failed to settle the call: it may be written. Skip its numbers.
                sequence.next = first + count;
                sequence.gap = true;
                let shard = call.shard;
                let source = RedisFailure::from_redis_arc(source);
                return vec![Err(PublishError::ConnectionLost { shard, source }); records.len()];
            }
            return replication.apply(results(call, &spec, outcome));
        }
    }

    /// Runs script calls of one shard in one pipeline. Calls answered `NOSCRIPT` (a restarted or failed-over
    /// Redis: nothing executed) are sent again once, after `SCRIPT LOAD`. With each outcome, what the `WAIT`
    /// behind the call's pipeline confirmed (durable producer).
    async fn calls(&self, call: Call<'_>, specs: &[CallSpec<'_>]) -> Vec<(CallOutcome, Replication)> {
        let mut outcomes: Vec<Option<(CallOutcome, Replication)>> = (0..specs.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..specs.len()).collect();
        for load in [false, true] {
            if pending.is_empty() {
                break;
            }
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            if load {
                self.script.add_load(&mut pipe);
            }
            for &c in &pending {
                let spec = &specs[c];
                let call = Call {
                    sequence: spec.sequence,
                    ..call
                };
                self.script
                    .add_call(&mut pipe, &self.stream, call, spec.records.iter().copied());
            }
            let (mut replies, replication) = self.route.send(call.shard, &pipe).await;
            if load && !replies.is_empty() {
                // A failed load shows as NOSCRIPT again in the calls behind it.
                let _load = replies.remove(0);
            }
            if replies.len() != pending.len() {
                for &c in &pending {
                    let detail = format!("{} replies to {} script calls", replies.len(), pending.len());
                    outcomes[c] = Some((CallOutcome::Unexpected(detail), replication.clone()));
                }
                break;
            }
            let mut again = Vec::new();
            for (c, reply) in pending.iter().copied().zip(replies) {
                let outcome = match reply {
                    CmdOutcome::Reply(Err(e))
                        if !load && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        again.push(c);
                        continue;
                    }
                    CmdOutcome::Reply(Err(e)) => CallOutcome::Rejected(Arc::new(e)),
                    CmdOutcome::Reply(Ok(value)) => match parse_reply(value, specs[c].records.len()) {
                        Some(reply) => CallOutcome::Reply(reply),
                        None => CallOutcome::Unexpected("not an answer of the publish script".into()),
                    },
                    CmdOutcome::Connect(f) => CallOutcome::Connect(f),
                    CmdOutcome::Lost(e) => CallOutcome::Lost(e),
                    CmdOutcome::Unsettled(reason, e) => CallOutcome::Unsettled(reason, e),
                    CmdOutcome::Unexpected(detail) => CallOutcome::Unexpected(detail),
                };
                outcomes[c] = Some((outcome, replication.clone()));
            }
            pending = again;
        }
        outcomes
            .into_iter()
            .map(|o| o.expect("every call has an outcome"))
            .collect()
    }
}

/// Moves the shard's sequence on after one attempt of an idempotent call of `count` records from `first`, and
/// answers whether to retry it; `lost` keeps the first failure after which the call may have been executed.
fn after_attempt(
    sequence: &mut ShardSequence,
    first: u64,
    count: u64,
    outcome: &CallOutcome,
    lost: &mut Option<Arc<RedisError>>,
) -> bool {
    match outcome {
        CallOutcome::Reply(ScriptReply::Written(_) | ScriptReply::Duplicate(_)) => {
            sequence.next = first + count;
            sequence.gap = false;
            false
        }
        // The duplicate check comes before the fence in the script: a fenced call was not written by any
        // attempt, and its numbers are left for the next call.
        CallOutcome::Reply(ScriptReply::Fenced(_)) => false,
        // The shard lost our last calls (a failover): nothing of this call is there; resume with a gap.
        CallOutcome::Reply(ScriptReply::OutOfOrder { .. }) if !sequence.gap => {
            sequence.gap = true;
            true
        }
        CallOutcome::Reply(ScriptReply::OutOfOrder { .. }) => false,
        CallOutcome::Reply(ScriptReply::OutOfWindow { next }) => {
            sequence.next = (*next).max(first + count);
            sequence.gap = true;
            false
        }
        CallOutcome::Lost(e) => {
            lost.get_or_insert_with(|| e.clone());
            true
        }
        CallOutcome::Connect(_) | CallOutcome::Rejected(_) | CallOutcome::Unsettled(..) => lost.is_some(),
        CallOutcome::Unexpected(_) => {
            sequence.next = first + count;
            sequence.gap = true;
            false
        }
    }
}

/// One result per record of a call.
fn results(call: Call<'_>, spec: &CallSpec<'_>, outcome: CallOutcome) -> Vec<Result<Published, PublishError>> {
    let (shard, routing_version) = (call.shard, call.presented.version);
    let n = spec.records.len();
    let sequence = spec.sequence.map_or(0, |s| s.first);
    let err = match outcome {
        CallOutcome::Reply(ScriptReply::Written(ids)) => return published(shard, routing_version, ids, false),
        CallOutcome::Reply(ScriptReply::Duplicate(ids)) => return published(shard, routing_version, ids, true),
        CallOutcome::Reply(ScriptReply::Fenced(fence)) => PublishError::Fenced {
            shard,
            routing_version,
            fence,
        },
        CallOutcome::Reply(ScriptReply::OutOfOrder { expected }) => PublishError::OutOfOrderSequence {
            shard,
            sequence,
            expected,
        },
        CallOutcome::Reply(ScriptReply::OutOfWindow { next }) => {
            PublishError::SequenceOutOfWindow { shard, sequence, next }
        }
        CallOutcome::Rejected(source) => PublishError::Rejected {
            shard,
            source: RedisFailure::from_redis_arc(source),
        },
        CallOutcome::Connect(f) => f.into_publish_error(shard),
        CallOutcome::Lost(source) => PublishError::ConnectionLost {
            shard,
            source: RedisFailure::from_redis_arc(source),
        },
        CallOutcome::Unsettled(reason, source) => PublishError::ClusterUnsettled {
            shard,
            reason,
            source: RedisFailure::from_redis_arc(source),
        },
        CallOutcome::Unexpected(detail) => PublishError::UnexpectedReply { shard, detail },
    };
    vec![Err(err); n]
}

fn published(
    shard: ShardId,
    routing_version: RoutingVersion,
    ids: Vec<EntryId>,
    duplicate: bool,
) -> Vec<Result<Published, PublishError>> {
    ids.into_iter()
        .map(|id| {
            Ok(Published {
                shard,
                id,
                routing_version,
                duplicate,
            })
        })
        .collect()
}
