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
use crate::record::Record;
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

/// What one call checks and where it writes, besides its records.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call<'a> {
    /// The shard written to.
    pub shard: ShardId,
    /// The routing shown to the shard's fence.
    pub presented: Presented,
    /// The trimming of every `XADD`.
    pub trim: ScriptTrim<'a>,
    /// The sequence, when the producer is idempotent.
    pub sequence: Option<Sequence<'a>>,
}

/// How the script trims (mirrors [`Trim`](crate::config::Trim), with the threshold resolved for this call).
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

    /// Adds one `EVALSHA` writing `records` (all of `call.shard`) to `pipe`.
    pub(crate) fn add_call<'r>(
        &self,
        pipe: &mut redis::Pipeline,
        stream: &StreamName,
        call: Call<'_>,
        records: impl ExactSizeIterator<Item = &'r Record> + Clone,
    ) {
        let Call {
            shard,
            presented,
            trim,
            sequence,
        } = call;
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
pub(crate) fn args_of(record: &Record) -> usize {
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
mod tests;
