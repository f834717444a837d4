//! The publish script: one `EVALSHA` writes one batch of records into one shard stream, or nothing.
//!
//! # What one call checks, in this order
//! 1. *Idempotence* (only when the producer is idempotent): the batch's first sequence number against the
//!    producer's state for the shard ([`keys::producer_sequence`]). A retry of the last batch written answers
//!    [`ScriptReply::Duplicate`] with the original entry ids and writes nothing; this comes first so that a batch
//!    written just before a seal is still recognised as written when its retry arrives after it.
//! 2. *Fence*: the producer's routing version against the shard's record ([`keys::shard_fence`]): its fence and,
//!    when the routing promises shard records, its birth and the shard counts of both layouts (the rule of
//!    [`crate::fence`]). A refusal answers
//!    [`ScriptReply::Fenced`] and writes nothing.
//! 3. The shard key's type (a key that is not a stream fails the whole batch before anything is written).
//!
//! Then every record is `XADD`ed (with the producer's trimming), and the sequence state is advanced. A Redis
//! script runs atomically, so either the whole batch is in the stream or none of it; the checks come first
//! because a script that fails half-way keeps what it already wrote.
//!
//! # Arguments and answer
//! A batch whose records all have the same number of fields is sent without a field count per record, and
//! one-field records are passed to `XADD` directly: the script's Redis CPU per record is what limits a saturated
//! Redis (`scripts/script-cost.sh` counts it). The entry ids of one call are answered, and remembered for
//! [`ScriptReply::Duplicate`], as one run `<first id>+<count>` when they are consecutive (as `XADD *` gives them
//! within one call), else as the list of every id ([`expand_ids`] reads both).
//!
//! # Sequence rules (idempotent producer)
//! Per (producer id, shard) the producer numbers its records 0, 1, 2, ... in the order it sends them to the
//! shard, and sends at most one batch per shard at a time. The state remembers `epoch` (a random value per
//! producer instance), `next` (the sequence number after the last batch written), and the last batch written
//! (`first` and its entry `ids`, in either form above). For a batch starting at `s`:
//!
//! | state | answer |
//! |---|---|
//! | absent, or another `epoch` (a new producer instance, or expired) | write, start the state at `s` |
//! | `s == next` | write |
//! | `s < next` and `s == first` | [`Duplicate`](ScriptReply::Duplicate): the last batch again, its ids |
//! | `s < next` otherwise | [`OutOfWindow`](ScriptReply::OutOfWindow): an older batch, outcome not remembered |
//! | `s > next` (a gap) | [`OutOfOrder`](ScriptReply::OutOfOrder), nothing written; accepted only when the batch says a gap is expected (its predecessor's outcome stayed unknown) |
//!
//! The remembered window is one batch per (producer, shard), at most [`MAX_RECORDS_PER_CALL`] ids: the SDK has
//! at most one batch per shard in flight and only ever retries that one, so the window covers every retry it
//! can send. The state key expires after the producer's idle expiry (`PEXPIRE`, renewed by every call, so it
//! works on Redis 6.2 without per-field expiry).
//!
//! Every key a call touches carries the shard's hash tag, so the script runs in one Redis Cluster slot.

use crate::fence::Presented;
use protocol::names::StreamName;
use protocol::{keys, EntryId, RoutingVersion, ShardId};
use redis::Value;

/// Most records in one call. Bounds the argument list of one `EVALSHA`, the time one call holds Redis, and the
/// idempotence window (the ids of one call).
pub(crate) const MAX_RECORDS_PER_CALL: usize = 512;

/// Most arguments in one call (records are split into more calls before this is reached).
pub(crate) const MAX_ARGS_PER_CALL: usize = 64 * 1024;

/// Most fields in one record on the scripted path (each record is one `XADD` built from a Lua table, and Lua's
/// `unpack` has a stack limit of about 8000 values).
pub(crate) const MAX_FIELDS_PER_RECORD: usize = 1000;

const LUA: &str = r#"
local A = ARGV
local n = tonumber(A[8])
local uniform = tonumber(A[9])
if not n or not uniform or uniform < 0 then return redis.error_reply('ERR publish script: malformed header') end
-- Layout check before anything is written. Uniform (every record has `uniform` fields): the fields follow the
-- header directly; else every record is its field count then its fields.
local starts, counts
if uniform > 0 then
  if #A ~= 10 + 2 * uniform * n then return redis.error_reply('ERR publish script: malformed arguments') end
else
  starts, counts = {}, {}
  local pos = 11
  for i = 1, n do
    local f = tonumber(A[pos])
    if not f or f < 1 then return redis.error_reply('ERR publish script: malformed record ' .. i) end
    starts[i] = pos
    counts[i] = f
    pos = pos + 1 + 2 * f
  end
  if pos ~= #A + 1 then return redis.error_reply('ERR publish script: malformed arguments') end
end
local first = nil
if A[4] ~= '' then
  first = tonumber(A[4])
  local st = redis.call('HMGET', KEYS[3], 'epoch', 'next', 'first', 'ids')
  if st[1] == A[5] then
    local nxt = tonumber(st[2])
    if first < nxt then
      if first == tonumber(st[3]) then
        redis.call('PEXPIRE', KEYS[3], A[7])
        return {'DUPLICATE', st[4]}
      end
      return {'OUT_OF_WINDOW', st[2]}
    end
    if first > nxt and A[6] ~= '1' then return {'OUT_OF_ORDER', st[2]} end
  end
end
local version = tonumber(A[1])
local record = redis.call('HMGET', KEYS[2], 'routingVersion', 'bornVersion', 'fenceCount', 'bornCount')
local fence = 0
if record[1] then
  fence = tonumber(record[1])
  -- Fail closed: a fence this script cannot read refuses the call instead of letting it through.
  if not fence then return redis.error_reply('CORRUPT fence ' .. KEYS[2] .. ' holds a non-number') end
end
if version < fence then return {'FENCED', string.format('%.0f', fence)} end
-- A[10] > 0: the routing promises shard records and has that many shards (crate::fence): the shard must exist
-- at the producer's routing, and neither its fence nor its birth may name a layout with more shards.
local shards = tonumber(A[10])
if shards and shards > 0 then
  local newer = {'FENCED', string.format('%.0f', version + 1)}
  if record[3] then
    local c = tonumber(record[3])
    if not c then return redis.error_reply('CORRUPT fence ' .. KEYS[2] .. ' holds a non-number count') end
    if c > shards then return newer end
  end
  if not record[2] then return newer end
  local born = tonumber(record[2])
  if not born then return redis.error_reply('CORRUPT fence ' .. KEYS[2] .. ' holds a non-number birth') end
  if born > version then return {'FENCED', string.format('%.0f', born)} end
  if record[4] then
    local c = tonumber(record[4])
    if not c then return redis.error_reply('CORRUPT fence ' .. KEYS[2] .. ' holds a non-number count') end
    if c > shards then return newer end
  end
end
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'stream' and t ~= 'none' then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
local ids = {}
local call = redis.call
local k = KEYS[1]
local tm, tv = A[2], A[3]
local trim = tm ~= ''
-- One-field records, the commonest shape, pass their arguments to XADD directly: every Lua operation per record
-- (an argument table, unpack) costs Redis CPU that a plain XADD pipeline does not spend.
if uniform == 1 then
  local j = 0
  for p = 11, #A, 2 do
    j = j + 1
    if trim then
      ids[j] = call('XADD', k, tm, '~', tv, '*', A[p], A[p + 1])
    else
      ids[j] = call('XADD', k, '*', A[p], A[p + 1])
    end
  end
else
  -- One argument table for every record: the fields overwrite the previous record's, and unpack takes exactly
  -- this record's length.
  local a, head
  if trim then a, head = {k, tm, '~', tv, '*'}, 5 else a, head = {k, '*'}, 2 end
  for i = 1, n do
    local p, f
    if uniform > 0 then p, f = 10 + 2 * uniform * (i - 1), uniform else p, f = starts[i], counts[i] end
    local m = 2 * f
    for j = 1, m do a[head + j] = A[p + j] end
    ids[i] = call('XADD', unpack(a, 1, head + m))
  end
end
-- The ids of one call are usually one run (same millisecond, consecutive sequence numbers): then the answer
-- and the idempotence state carry the first id and the count instead of every id.
local written = ids
local ms1, s1, msn, sn
if n > 0 then
  ms1, s1 = string.match(ids[1], '^(%d+)%-(%d+)$')
  msn, sn = string.match(ids[n], '^(%d+)%-(%d+)$')
end
if ms1 and ms1 == msn and #s1 <= 15 and #sn <= 15 and tonumber(sn) - tonumber(s1) == n - 1 then
  written = ids[1] .. '+' .. n
end
if first then
  local remembered = written
  if type(written) == 'table' then remembered = table.concat(ids, ' ') end
  redis.call('HSET', KEYS[3], 'epoch', A[5], 'next', string.format('%.0f', first + n),
    'first', A[4], 'ids', remembered)
  redis.call('PEXPIRE', KEYS[3], A[7])
end
return {'WRITTEN', written}
"#;

/// The script's source and SHA1 (computed once per producer).
#[derive(Debug)]
pub(crate) struct PublishScript {
    script: redis::Script,
}

impl Default for PublishScript {
    fn default() -> Self {
        PublishScript {
            script: redis::Script::new(LUA),
        }
    }
}

/// The sequence part of an idempotent call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sequence<'a> {
    /// The producer id (part of the state key).
    pub producer_id: &'a str,
    /// The producer instance's epoch.
    pub epoch: &'a str,
    /// Sequence number of the call's first record.
    pub first: u64,
    /// Whether a gap before `first` is expected (the previous batch's outcome stayed unknown).
    pub gap: bool,
    /// Idle expiry of the state key, in ms.
    pub idle_ms: u64,
}

/// How the script trims (mirrors [`crate::Trim`], with the threshold resolved for this call).
#[derive(Debug, Clone, Copy)]
pub(crate) enum ScriptTrim<'a> {
    None,
    MaxLen(u64),
    MinId(&'a str),
}

/// What one call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScriptReply {
    /// Every record was written; one entry id per record.
    Written(Vec<EntryId>),
    /// The batch had been written by an earlier attempt; its original entry ids.
    Duplicate(Vec<EntryId>),
    /// The producer's routing version is below the shard's fence; nothing written.
    Fenced(RoutingVersion),
    /// The batch's first sequence number leaves a gap after `expected`; nothing written.
    OutOfOrder { expected: u64 },
    /// The batch is older than the last one written; nothing written by this call, and whether an earlier
    /// attempt wrote it is no longer remembered.
    OutOfWindow { next: u64 },
}

impl PublishScript {
    /// The script's source (loaded by every new connection, so the first calls need no `NOSCRIPT` round trip).
    pub(crate) fn source() -> &'static str {
        LUA
    }

    /// Adds `SCRIPT LOAD` to `pipe` (after a `NOSCRIPT`: a restarted or failed-over Redis).
    pub(crate) fn add_load(&self, pipe: &mut redis::Pipeline) {
        pipe.cmd("SCRIPT").arg("LOAD").arg(LUA);
    }

    /// Adds one `EVALSHA` writing `records` (all of `shard`) to `pipe`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_call<'r>(
        &self,
        pipe: &mut redis::Pipeline,
        stream: &StreamName,
        shard: ShardId,
        presented: Presented,
        trim: ScriptTrim<'_>,
        sequence: Option<Sequence<'_>>,
        records: impl ExactSizeIterator<Item = &'r crate::Record> + Clone,
    ) {
        // Sized up front (the call has hundreds of arguments; growing doubles and copies its buffers).
        let (args, bytes) = records.clone().fold((16, 256), |(a, b), r| {
            let fields = r.fields();
            (
                a + 1 + 2 * fields.len(),
                b + 4 + fields.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>(),
            )
        });
        let mut call = redis::Cmd::with_capacity(args, bytes);
        let cmd = call.arg("EVALSHA").arg(self.script.get_hash()).arg(3);
        cmd.arg(keys::shard_stream(stream, shard))
            .arg(keys::shard_fence(stream, shard));
        match &sequence {
            Some(s) => cmd.arg(keys::producer_sequence(stream, shard, s.producer_id)),
            // Not touched, but named so that the call still names only keys of the shard's slot.
            None => cmd.arg(keys::producer_sequence(stream, shard, "-")),
        };
        cmd.arg(presented.version.0);
        match trim {
            ScriptTrim::None => cmd.arg("").arg(""),
            ScriptTrim::MaxLen(n) => cmd.arg("MAXLEN").arg(n),
            ScriptTrim::MinId(id) => cmd.arg("MINID").arg(id),
        };
        match sequence {
            Some(s) => cmd
                .arg(s.first)
                .arg(s.epoch)
                .arg(if s.gap { "1" } else { "0" })
                .arg(s.idle_ms),
            None => cmd.arg("").arg("").arg("0").arg(0),
        };
        cmd.arg(records.len());
        let mut fields = records.clone().map(|r| r.fields().len());
        let uniform = fields.next().filter(|&f| fields.all(|g| g == f)).unwrap_or(0);
        cmd.arg(uniform);
        // The record check's flag is the routing's shard count (at least 1): the script compares it with the
        // counts the record holds. 0: no record check.
        cmd.arg(if presented.records { presented.count.max(1) } else { 0 });
        for r in records {
            if uniform == 0 {
                cmd.arg(r.fields().len());
            }
            for (name, value) in r.fields() {
                cmd.arg(name.as_slice()).arg(value.as_slice());
            }
        }
        pipe.add_command(call);
    }
}

/// Arguments one record adds to a call.
pub(crate) fn args_of(record: &crate::Record) -> usize {
    1 + 2 * record.fields().len()
}

/// Reads the script's answer for a call of `count` records. `None`: not an answer this script gives.
pub(crate) fn parse_reply(value: Value, count: usize) -> Option<ScriptReply> {
    let Value::Array(items) = value else {
        return None;
    };
    let mut items = items.into_iter();
    let tag = text(items.next()?)?;
    let reply = match tag.as_str() {
        "WRITTEN" => match items.next()? {
            Value::Array(ids) => ScriptReply::Written(ids.iter().map(entry_id).collect::<Option<_>>()?),
            run => ScriptReply::Written(expand_ids(&text(run)?, count)?),
        },
        "DUPLICATE" => ScriptReply::Duplicate(expand_ids(&text(items.next()?)?, count)?),
        "FENCED" => ScriptReply::Fenced(RoutingVersion(text(items.next()?)?.parse().ok()?)),
        "OUT_OF_ORDER" => ScriptReply::OutOfOrder {
            expected: text(items.next()?)?.parse().ok()?,
        },
        "OUT_OF_WINDOW" => ScriptReply::OutOfWindow {
            next: text(items.next()?)?.parse().ok()?,
        },
        _ => return None,
    };
    match &reply {
        ScriptReply::Written(ids) | ScriptReply::Duplicate(ids) if ids.len() != count => None,
        _ => Some(reply),
    }
}

/// The entry ids of a call as the script writes them in its answer and its idempotence state: either every id,
/// space-separated, or one run `<ms>-<seq>+<count>` (ids `<ms>-<seq>` .. `<ms>-<seq + count - 1>`, what `XADD *`
/// gives records written by one script call within one millisecond). `None`: neither form, or not `count` ids.
pub(crate) fn expand_ids(text: &str, count: usize) -> Option<Vec<EntryId>> {
    let Some((first, n)) = text.split_once('+') else {
        let ids: Vec<EntryId> = text.split(' ').map(|id| id.parse().ok()).collect::<Option<_>>()?;
        return (ids.len() == count).then_some(ids);
    };
    let first: EntryId = first.parse().ok()?;
    let n: usize = n.parse().ok()?;
    if n != count || first.seq.checked_add(n as u64).is_none() {
        return None;
    }
    Some(
        (0..n as u64)
            .map(|i| EntryId {
                ms: first.ms,
                seq: first.seq + i,
            })
            .collect(),
    )
}

/// A reply value as an entry id (`XADD`'s answer), read without copying it into a `String`.
pub(crate) fn entry_id(value: &Value) -> Option<EntryId> {
    match value {
        Value::BulkString(bytes) => EntryId::from_bytes(bytes),
        Value::SimpleString(s) => EntryId::from_bytes(s.as_bytes()),
        _ => None,
    }
}

/// A reply value as text (an entry id, a status word): bulk or simple strings only.
pub(crate) fn text(value: Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn id(s: &str) -> EntryId {
        s.parse().unwrap()
    }

    #[test]
    fn replies_are_read_and_checked_against_the_record_count() {
        let written = Value::Array(vec![bulk("WRITTEN"), Value::Array(vec![bulk("1-0"), bulk("1-1")])]);
        assert_eq!(
            parse_reply(written.clone(), 2),
            Some(ScriptReply::Written(vec![id("1-0"), id("1-1")]))
        );
        assert_eq!(parse_reply(written, 3), None, "a count mismatch is not an answer");
        assert_eq!(
            parse_reply(Value::Array(vec![bulk("DUPLICATE"), bulk("1-0 1-1")]), 2),
            Some(ScriptReply::Duplicate(vec![id("1-0"), id("1-1")]))
        );
        assert_eq!(
            parse_reply(Value::Array(vec![bulk("FENCED"), bulk("7")]), 2),
            Some(ScriptReply::Fenced(RoutingVersion(7)))
        );
        assert_eq!(
            parse_reply(Value::Array(vec![bulk("OUT_OF_ORDER"), bulk("12")]), 2),
            Some(ScriptReply::OutOfOrder { expected: 12 })
        );
        assert_eq!(parse_reply(Value::Array(vec![bulk("NOPE")]), 2), None);
        assert_eq!(parse_reply(bulk("1-0"), 1), None);
    }

    #[test]
    fn ids_are_read_as_a_list_or_as_one_run() {
        assert_eq!(expand_ids("5-9+3", 3), Some(vec![id("5-9"), id("5-10"), id("5-11")]));
        assert_eq!(expand_ids("1-0 1-1", 2), Some(vec![id("1-0"), id("1-1")]));
        assert_eq!(expand_ids("5-9+3", 4), None, "a run of another length");
        assert_eq!(expand_ids("1-0 1-1", 3), None, "a list of another length");
        for bad in ["5+3", "x-1+3", "5-y+3", "5-1+z", "5-18446744073709551615+2"] {
            assert_eq!(expand_ids(bad, 3.min(bad.len())), None, "{bad}");
        }
        let written = Value::Array(vec![bulk("WRITTEN"), bulk("7-0+2")]);
        assert_eq!(
            parse_reply(written, 2),
            Some(ScriptReply::Written(vec![id("7-0"), id("7-1")]))
        );
    }

    #[test]
    fn a_call_names_only_keys_of_the_shard_slot() {
        let script = PublishScript::default();
        let stream = StreamName::new("orders").unwrap();
        let records = [crate::Record::with_key("k").field("f", "v")];
        for sequence in [
            None,
            Some(Sequence {
                producer_id: "p",
                epoch: "e",
                first: 0,
                gap: false,
                idle_ms: 1000,
            }),
        ] {
            let mut pipe = redis::pipe();
            script.add_call(
                &mut pipe,
                &stream,
                ShardId(3),
                Presented::unchecked(RoutingVersion(2)),
                ScriptTrim::MaxLen(10),
                sequence,
                records.iter(),
            );
            let packed = String::from_utf8_lossy(&pipe.get_packed_pipeline()).to_string();
            let words: Vec<&str> = packed.split("\r\n").filter(|w| !w.starts_with(['$', '*'])).collect();
            assert_eq!(words[0], "EVALSHA");
            assert_eq!(words[2], "3");
            let tag = keys::hash_tag(words[3]);
            assert_eq!(tag, keys::shard_tag(&stream, ShardId(3)));
            assert!(words[4..6].iter().all(|k| keys::hash_tag(k) == tag), "{words:?}");
        }
    }

    /// Runs the script against a real Redis (as the producer sends it) and reads its answer.
    struct Shard {
        con: redis::aio::MultiplexedConnection,
        stream: StreamName,
        script: PublishScript,
    }

    impl Shard {
        async fn new(redis: &test_support::RedisServer) -> Shard {
            let mut con = redis.connection().await;
            let () = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(PublishScript::source())
                .query_async::<String>(&mut con)
                .await
                .map(drop)
                .unwrap();
            Shard {
                con,
                stream: StreamName::new("orders").unwrap(),
                script: PublishScript::default(),
            }
        }

        async fn call(&mut self, version: u64, seq: Option<(&str, u64, bool)>, n: usize) -> Option<ScriptReply> {
            self.call_as(Presented::unchecked(RoutingVersion(version)), seq, n)
                .await
        }

        async fn call_as(
            &mut self,
            presented: Presented,
            seq: Option<(&str, u64, bool)>,
            n: usize,
        ) -> Option<ScriptReply> {
            let records: Vec<crate::Record> = (0..n)
                .map(|i| crate::Record::with_key("k").field("n", i.to_string()))
                .collect();
            let mut pipe = redis::pipe();
            self.script.add_call(
                &mut pipe,
                &self.stream,
                ShardId(0),
                presented,
                ScriptTrim::None,
                seq.map(|(epoch, first, gap)| Sequence {
                    producer_id: "p",
                    epoch,
                    first,
                    gap,
                    idle_ms: 60_000,
                }),
                records.iter(),
            );
            let mut replies: Vec<Value> = pipe.query_async(&mut self.con).await.unwrap();
            parse_reply(replies.pop().unwrap(), n)
        }

        async fn len(&mut self) -> u64 {
            redis::cmd("XLEN")
                .arg(keys::shard_stream(&self.stream, ShardId(0)))
                .query_async(&mut self.con)
                .await
                .unwrap()
        }

        async fn born(&mut self, version: u64) {
            let () = redis::cmd("HSET")
                .arg(keys::shard_fence(&self.stream, ShardId(0)))
                .arg(keys::shard_fence_fields::BORN_VERSION)
                .arg(version)
                .query_async::<u64>(&mut self.con)
                .await
                .map(drop)
                .unwrap();
        }

        async fn fence(&mut self, version: u64) {
            self.set(keys::shard_fence_fields::ROUTING_VERSION, &version.to_string())
                .await;
        }

        async fn set(&mut self, field: &str, value: &str) {
            let () = redis::cmd("HSET")
                .arg(keys::shard_fence(&self.stream, ShardId(0)))
                .arg(field)
                .arg(value)
                .query_async::<u64>(&mut self.con)
                .await
                .map(drop)
                .unwrap();
        }
    }

    fn ids(reply: Option<ScriptReply>) -> Vec<EntryId> {
        match reply {
            Some(ScriptReply::Written(ids)) => ids,
            other => panic!("expected Written, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_fenced_call_writes_nothing_and_a_current_one_writes_everything() {
        let redis = test_support::RedisServer::start().await;
        let mut shard = Shard::new(&redis).await;
        assert_eq!(ids(shard.call(1, None, 3).await).len(), 3, "no fence: version 1 writes");
        shard.fence(2).await;
        assert_eq!(
            shard.call(1, None, 3).await,
            Some(ScriptReply::Fenced(RoutingVersion(2)))
        );
        assert_eq!(shard.len().await, 3, "the fenced call wrote nothing");
        assert_eq!(
            ids(shard.call(2, None, 2).await).len(),
            2,
            "the fence version itself may write"
        );
        assert_eq!(ids(shard.call(3, None, 1).await).len(), 1);
        assert_eq!(shard.len().await, 6);
    }

    /// Issue 30: where the routing promises shard records, a shard without one (a growth Redis lost) or born at a
    /// later version (a version number that meant another layout) takes nothing; the refusal names a version the
    /// producer must reach, above its own. Without the promise (a stream not migrated yet) only the fence counts.
    #[tokio::test]
    async fn with_records_promised_only_a_shard_born_at_the_producers_routing_takes_the_write() {
        let redis = test_support::RedisServer::start().await;
        let mut shard = Shard::new(&redis).await;
        let checked = |v: u64| Presented {
            version: RoutingVersion(v),
            records: true,
            count: 4,
        };
        assert_eq!(
            shard.call_as(checked(4), None, 2).await,
            Some(ScriptReply::Fenced(RoutingVersion(5))),
            "no record: the shard does not exist at any routing Redis knows"
        );
        assert_eq!(ids(shard.call(4, None, 1).await).len(), 1, "not promised: not checked");
        shard.born(6).await;
        assert_eq!(
            shard.call_as(checked(4), None, 2).await,
            Some(ScriptReply::Fenced(RoutingVersion(6)))
        );
        assert_eq!(shard.len().await, 1, "the refused calls wrote nothing");
        assert_eq!(ids(shard.call_as(checked(6), None, 2).await).len(), 2);
        assert_eq!(ids(shard.call_as(checked(9), None, 1).await).len(), 1);
        // The fence comes first.
        shard.fence(10).await;
        assert_eq!(
            shard.call_as(checked(9), None, 1).await,
            Some(ScriptReply::Fenced(RoutingVersion(10)))
        );
        // The idempotence check comes before both: a retry of a written batch is still recognised.
        let first = shard.call_as(checked(10), Some(("e", 0, false)), 2).await;
        assert_eq!(ids(first).len(), 2);
        assert!(matches!(
            shard.call_as(checked(10), Some(("e", 0, false)), 2).await,
            Some(ScriptReply::Duplicate(_))
        ));
        assert_eq!(shard.len().await, 6);
    }

    /// Issue 30: a record whose fence or birth names a layout with more shards than the producer's refuses it
    /// (a version issued again after a restore, or a lost history's higher number), as `crate::fence` says; a
    /// count the script cannot read fails the call closed.
    #[tokio::test]
    async fn a_layout_with_fewer_shards_than_the_record_names_takes_nothing() {
        let redis = test_support::RedisServer::start().await;
        let mut shard = Shard::new(&redis).await;
        let with = |v: u64, count: u32| Presented {
            version: RoutingVersion(v),
            records: true,
            count,
        };
        shard.born(1).await;
        shard.fence(2).await;
        shard.set(keys::shard_fence_fields::FENCE_COUNT, "8").await;
        assert_eq!(
            shard.call_as(with(2, 4), None, 1).await,
            Some(ScriptReply::Fenced(RoutingVersion(3))),
            "v2 of 4 shards against a fence for v2 of 8"
        );
        assert_eq!(
            shard.call_as(with(9, 4), None, 1).await,
            Some(ScriptReply::Fenced(RoutingVersion(10)))
        );
        assert_eq!(ids(shard.call_as(with(2, 8), None, 1).await).len(), 1);
        assert_eq!(ids(shard.call(2, None, 1).await).len(), 1, "not promised: not checked");
        shard.set(keys::shard_fence_fields::BORN_COUNT, "12").await;
        assert_eq!(
            shard.call_as(with(2, 8), None, 1).await,
            Some(ScriptReply::Fenced(RoutingVersion(3))),
            "born into 12 shards"
        );
        assert_eq!(ids(shard.call_as(with(2, 12), None, 1).await).len(), 1);
        assert_eq!(shard.len().await, 3, "the refused calls wrote nothing");
        shard.set(keys::shard_fence_fields::BORN_COUNT, "many").await;
        let mut pipe = redis::pipe();
        let records = [crate::Record::with_key("k").field("n", "x")];
        shard.script.add_call(
            &mut pipe,
            &shard.stream,
            ShardId(0),
            with(2, 12),
            ScriptTrim::None,
            None,
            records.iter(),
        );
        let err = pipe
            .query_async::<Vec<Value>>(&mut shard.con)
            .await
            .expect_err("a corrupt count fails the call");
        assert!(err.to_string().contains("non-number count"), "{err}");
        assert_eq!(shard.len().await, 3);
    }

    #[tokio::test]
    async fn a_malformed_layout_is_refused_before_anything_is_written() {
        let redis = test_support::RedisServer::start().await;
        let mut shard = Shard::new(&redis).await;
        let stream_key = keys::shard_stream(&shard.stream, ShardId(0));
        let fence_key = keys::shard_fence(&shard.stream, ShardId(0));
        let seq_key = keys::producer_sequence(&shard.stream, ShardId(0), "-");
        // (record count, fields per record or 0, then the record arguments)
        let cases: [(&str, &str, &[&str], &str); 4] = [
            ("2", "1", &["f", "v"], "malformed arguments"),
            ("1", "-1", &["f", "v"], "malformed header"),
            ("1", "x", &["f", "v"], "malformed header"),
            ("2", "0", &["1", "f", "v", "0"], "malformed record 2"),
        ];
        for (count, uniform, fields, why) in cases {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(shard.script.script.get_hash())
                .arg(3)
                .arg(&stream_key)
                .arg(&fence_key)
                .arg(&seq_key)
                .arg(1)
                .arg("")
                .arg("")
                .arg("")
                .arg("")
                .arg("0")
                .arg(0)
                .arg(count)
                .arg(uniform)
                .arg("0")
                .arg(fields);
            let err = cmd.query_async::<Value>(&mut shard.con).await.unwrap_err();
            assert!(err.to_string().contains(why), "{count}/{uniform}: {err}");
        }
        assert_eq!(shard.len().await, 0, "nothing written by a refused call");
    }

    #[tokio::test]
    async fn an_unreadable_fence_refuses_the_call() {
        let redis = test_support::RedisServer::start().await;
        let mut shard = Shard::new(&redis).await;
        let () = redis::cmd("HSET")
            .arg(keys::shard_fence(&shard.stream, ShardId(0)))
            .arg(keys::shard_fence_fields::ROUTING_VERSION)
            .arg("seven")
            .query_async::<u64>(&mut shard.con)
            .await
            .map(drop)
            .unwrap();
        let mut pipe = redis::pipe();
        let records = [crate::Record::with_key("k").field("f", "v")];
        shard.script.add_call(
            &mut pipe,
            &shard.stream,
            ShardId(0),
            Presented::unchecked(RoutingVersion(9)),
            ScriptTrim::None,
            None,
            records.iter(),
        );
        let err = pipe.query_async::<Vec<Value>>(&mut shard.con).await.unwrap_err();
        assert!(err.to_string().contains("CORRUPT"), "{err}");
        assert_eq!(shard.len().await, 0);
    }

    #[tokio::test]
    async fn sequences_deduplicate_the_last_call_and_refuse_gaps() {
        let redis = test_support::RedisServer::start().await;
        let mut shard = Shard::new(&redis).await;
        let first = ids(shard.call(1, Some(("e1", 0, false)), 3).await);
        assert_eq!(
            shard.call(1, Some(("e1", 0, false)), 3).await,
            Some(ScriptReply::Duplicate(first.clone())),
            "a retry answers the original ids"
        );
        assert_eq!(shard.len().await, 3, "and writes nothing");
        // A gap (sequence 5 while 3 is next) is refused unless the call says one is expected.
        assert_eq!(
            shard.call(1, Some(("e1", 5, false)), 2).await,
            Some(ScriptReply::OutOfOrder { expected: 3 })
        );
        assert_eq!(shard.len().await, 3);
        let second = ids(shard.call(1, Some(("e1", 3, false)), 2).await);
        assert_eq!(
            ids(shard.call(1, Some(("e1", 7, true)), 1).await).len(),
            1,
            "an expected gap"
        );
        // Only the last call is remembered: the one before it is out of the window.
        assert_eq!(
            shard.call(1, Some(("e1", 3, false)), 2).await,
            Some(ScriptReply::OutOfWindow { next: 8 })
        );
        assert_eq!(shard.len().await, 6);
        assert_ne!(first, second);
        // A new instance (another epoch) with the same producer id starts its own sequence at 0.
        assert_eq!(ids(shard.call(1, Some(("e2", 0, false)), 1).await).len(), 1);
        assert_eq!(shard.len().await, 7);
    }

    #[tokio::test]
    async fn a_retry_after_the_seal_is_still_recognised_as_written() {
        let redis = test_support::RedisServer::start().await;
        let mut shard = Shard::new(&redis).await;
        let written = ids(shard.call(1, Some(("e", 0, false)), 2).await);
        shard.fence(2).await;
        assert_eq!(
            shard.call(1, Some(("e", 0, false)), 2).await,
            Some(ScriptReply::Duplicate(written)),
            "not Fenced: the records are in the shard, re-routing them would duplicate them"
        );
        assert_eq!(
            shard.call(1, Some(("e", 2, false)), 1).await,
            Some(ScriptReply::Fenced(RoutingVersion(2)))
        );
    }

    #[tokio::test]
    async fn the_sequence_state_is_bounded_and_expires() {
        let redis = test_support::RedisServer::start().await;
        let mut shard = Shard::new(&redis).await;
        for call in 0..20u64 {
            ids(shard.call(1, Some(("e", call * 10, false)), 10).await);
        }
        let key = keys::producer_sequence(&shard.stream, ShardId(0), "p");
        let fields: u64 = redis::cmd("HLEN").arg(&key).query_async(&mut shard.con).await.unwrap();
        assert_eq!(
            fields, 4,
            "epoch, next, first and the ids of the last call, however many calls"
        );
        let ids_len: u64 = redis::cmd("HSTRLEN")
            .arg(&key)
            .arg("ids")
            .query_async(&mut shard.con)
            .await
            .unwrap();
        assert!(ids_len < 10 * 40, "the ids of one call only ({ids_len} bytes)");
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut shard.con).await.unwrap();
        assert!(ttl > 0 && ttl <= 60_000, "idle expiry set: {ttl}");
        // Not idempotent: no state at all.
        ids(shard.call(1, None, 1).await);
        let exists: u64 = redis::cmd("EXISTS")
            .arg(keys::producer_sequence(&shard.stream, ShardId(0), "-"))
            .query_async(&mut shard.con)
            .await
            .unwrap();
        assert_eq!(exists, 0);
    }

    #[tokio::test]
    async fn one_field_records_with_trimming_are_written_and_trimmed() {
        let redis = test_support::RedisServer::start().await;
        let mut shard = Shard::new(&redis).await;
        let records: Vec<crate::Record> = (0..300)
            .map(|i| crate::Record::with_key("k").field("n", i.to_string()))
            .collect();
        let mut pipe = redis::pipe();
        shard.script.add_call(
            &mut pipe,
            &shard.stream,
            ShardId(0),
            Presented::unchecked(RoutingVersion(1)),
            ScriptTrim::MaxLen(100),
            None,
            records.iter(),
        );
        let mut replies: Vec<Value> = pipe.query_async(&mut shard.con).await.unwrap();
        let written = ids(parse_reply(replies.pop().unwrap(), 300));
        assert_eq!(written.len(), 300);
        let len = shard.len().await;
        assert!((100..300).contains(&len), "approximate trimming kept {len} of 300");
        let last: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
            .arg(keys::shard_stream(&shard.stream, ShardId(0)))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut shard.con)
            .await
            .unwrap();
        assert_eq!(
            last[0].0,
            written[299].to_string(),
            "the answer's last id is the stream's last entry"
        );
        assert_eq!(last[0].1, vec![("n".to_owned(), "299".to_owned())]);
    }

    #[tokio::test]
    async fn records_of_different_sizes_keep_exactly_their_fields_with_trimming() {
        let redis = test_support::RedisServer::start().await;
        let mut shard = Shard::new(&redis).await;
        let records = [
            crate::Record::with_key("k")
                .field("a", "1")
                .field("b", "2")
                .field("c", "3"),
            crate::Record::with_key("k").field("d", "4"),
            crate::Record::with_key("k").field("e", "").field("f", "6"),
        ];
        let mut pipe = redis::pipe();
        shard.script.add_call(
            &mut pipe,
            &shard.stream,
            ShardId(0),
            Presented::unchecked(RoutingVersion(1)),
            ScriptTrim::MaxLen(1000),
            None,
            records.iter(),
        );
        let mut replies: Vec<Value> = pipe.query_async(&mut shard.con).await.unwrap();
        ids(parse_reply(replies.pop().unwrap(), 3));
        let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(keys::shard_stream(&shard.stream, ShardId(0)))
            .arg("-")
            .arg("+")
            .query_async(&mut shard.con)
            .await
            .unwrap();
        let fields: Vec<Vec<(String, String)>> = entries.into_iter().map(|(_, f)| f).collect();
        let pair = |n: &str, v: &str| (n.to_owned(), v.to_owned());
        assert_eq!(
            fields,
            vec![
                vec![pair("a", "1"), pair("b", "2"), pair("c", "3")],
                vec![pair("d", "4")],
                vec![pair("e", ""), pair("f", "6")],
            ]
        );
    }
}
