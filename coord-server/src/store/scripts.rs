//! The store's Lua scripts: `LOAD` and `COMMIT` (each after the shared strict field checks), `ADOPT_RUN_ID` and
//! `RELEASE`. Every script touches keys of one hash tag only, so it runs on Redis Cluster (see the store's module
//! docs for why each one stays right when it runs twice).

/// Lua helpers shared by `LOAD` and `COMMIT`: the strict parsing of every stored field. A field is a canonical
/// decimal (no sign, no leading zero, no spaces) short enough to be exact as a Lua number and as a Redis integer;
/// anything else is corrupt. The checks run before the script writes anything (Redis does not roll back a script
/// that fails half way), so a corrupt hash is answered `METADATA_UNAVAILABLE` and left exactly as it was.
pub(super) const FIELD_CHECKS: &str = r#"
local function canonical(v, digits)
  return #v <= digits and (v == '0' or string.find(v, '^[1-9]%d*$') ~= nil)
end
local function quote(v) return string.format('%q', string.sub(v, 1, 40)) end
local function check_hash(f, schema, layout, legacy)
  if f[1] and not canonical(f[1], 18) then return 'revision is ' .. quote(f[1]) end
  if f[2] and not canonical(f[2], 18) then return 'livenessRevision is ' .. quote(f[2]) end
  if f[3] and not canonical(f[3], 9) then return 'schemaVersion is ' .. quote(f[3]) end
  if f[4] and not canonical(f[4], 9) then return 'layoutVersion is ' .. quote(f[4]) end
  if f[5] and not (#f[5] == 40 and string.find(f[5], '^%x+$')) then return 'runId is ' .. quote(f[5]) end
  if f[6] and not canonical(f[6], 15) then return 'updatedAt is ' .. quote(f[6]) end
  if f[1] then
    if f[4] ~= layout then
      return 'unknown layoutVersion ' .. quote(f[4] or 'missing') .. ' (this build understands ' .. layout .. ')'
    end
    if f[3] ~= schema and (legacy == nil or f[3] ~= legacy) then
      return 'unknown schemaVersion ' .. quote(f[3] or 'missing') .. ' (this build understands ' .. schema .. ')'
    end
  end
  return nil
end
local function check_lease(m, v)
  if v and not canonical(v, 15) then return 'liveness of ' .. quote(m) .. ' is ' .. quote(v) end
  return nil
end
local FIELDS = {'revision', 'livenessRevision', 'schemaVersion', 'layoutVersion', 'runId', 'updatedAt'}
"#;

/// Validates, then takes the mutex (`SET NX PX`) and reads. A corrupt hash answers `{2, why}` without taking the
/// mutex; a busy mutex answers `{0, holder}` so the caller can recognise a stale mutex of its own.
///
/// ARGV: token, ttl ms, cached revision, cached aggregate check (`len:<bytes>` or `sha1:<hex>`), schema, layout,
/// liveness scope, members...
pub(super) const LOAD: &str = r#"
local f = redis.call('HMGET', KEYS[1], unpack(FIELDS))
local bad = check_hash(f, ARGV[5], ARGV[6])
if bad then return {2, bad} end
local live = {}
if ARGV[7] == '*' then
  -- Read as stored: an unreadable lease is that member's alone (the caller counts it as never ending), not the
  -- group's; only the sections that would renew it (its own heartbeat, its join) refuse it, below.
  live = redis.call('HGETALL', KEYS[2])
elseif ARGV[7] == 'm' and #ARGV > 7 then
  local members = {unpack(ARGV, 8)}
  local values = redis.call('HMGET', KEYS[2], unpack(members))
  for i, m in ipairs(members) do
    bad = check_lease(m, values[i])
    if bad then return {2, bad} end
    if values[i] then live[#live + 1] = m; live[#live + 1] = values[i] end
  end
end
-- Free: missing or empty (released). Our own token: this LOAD was sent again after it ran (a cluster client
-- re-sends after a lost connection); tokens are unique per attempt, so the mutex is ours: go on as if just taken.
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= '' and holder ~= ARGV[1] then return {0, holder} end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
local t = redis.call('TIME')
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
-- The cache may skip sending and parsing the aggregate, never checking it: at the cached revision, the stored
-- aggregate must still have the cached length (O(1): a deleted or replaced aggregate), or, when asked (ticks),
-- the cached SHA-1 (any edit, at the price of hashing it).
local agg, hit = '', 0
if f[1] then
  local same = false
  if f[1] == ARGV[3] then
    local kind, want = string.match(ARGV[4], '^(%a+):(%w+)$')
    if kind == 'len' then
      same = redis.call('HSTRLEN', KEYS[1], 'aggregate') == tonumber(want)
    elseif kind == 'sha1' then
      local a = redis.call('HGET', KEYS[1], 'aggregate')
      same = a and redis.sha1hex(a) == want
    end
  end
  if same then hit = 1 else agg = redis.call('HGET', KEYS[1], 'aggregate') or '' end
end
return {1, t[1], t[2], f[1] or '', f[2] or '0', f[3] or '', f[4] or '', agg, live, f[5] or '', run,
  redis.call('EXISTS', KEYS[2]), hit}
"#;

/// Validates everything it reads or overwrites, then writes; a corrupt hash answers `{2, why}` with nothing
/// written and the mutex released.
///
/// ARGV: token, expected revision, expected liveness revision, aggregate, schema, layout, updatedAt, runId,
/// SHA-1 of the aggregate the decision read, renewal count, (member, lease)..., forgotten members...
pub(super) const COMMIT: &str = r#"
local function release()
  if redis.call('GET', KEYS[3]) ~= ARGV[1] then return end
  if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('SET', KEYS[3], '') else redis.call('DEL', KEYS[3]) end
end
local function corrupt(why)
  release()
  return {2, why}
end
local f = redis.call('HMGET', KEYS[1], unpack(FIELDS))
local bad = check_hash(f, ARGV[5], ARGV[6])
if bad then return corrupt(bad) end
local rev = f[1] or ''
local live = f[2] or '0'
if rev ~= ARGV[2] or (ARGV[4] ~= '' and live ~= ARGV[3]) then
  release()
  return {0, rev}
end
-- A decision is written only to the server it was loaded from: after a failover between the load and here, what
-- the section wrote elsewhere before its commit (a growth's seals and records) may be lost while the revision
-- still matches. A conflict: the section loads again and sees the new run id.
if ARGV[4] ~= '' and ARGV[8] ~= '' and (string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or '') ~= ARGV[8] then
  release()
  return {0, rev}
end
if rev == '' and redis.call('EXISTS', KEYS[1]) == 1 then
  return corrupt('the hash exists without a revision')
end
if ARGV[4] ~= '' and rev ~= '' then
  -- Never overwrite an aggregate other than the one the decision read (a same-length edit passes LOAD's check).
  local stored = redis.call('HGET', KEYS[1], 'aggregate')
  if not stored or redis.sha1hex(stored) ~= ARGV[9] then
    return corrupt('the aggregate is not the one this decision read')
  end
end
local renewals = tonumber(ARGV[10])
local current = {}
for i = 0, renewals - 1 do
  local m = ARGV[11 + 2 * i]
  local v = redis.call('HGET', KEYS[2], m)
  bad = check_lease(m, v)
  if bad then return corrupt(bad) end
  current[i] = tonumber(v or '0')
end
local newrev = rev
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'aggregate', ARGV[4], 'schemaVersion', ARGV[5], 'layoutVersion', ARGV[6],
    'updatedAt', ARGV[7], 'runId', ARGV[8])
  newrev = redis.call('HINCRBY', KEYS[1], 'revision', 1)
end
for i = 0, renewals - 1 do
  local m, lease = ARGV[11 + 2 * i], ARGV[12 + 2 * i]
  if tonumber(lease) > current[i] then redis.call('HSET', KEYS[2], m, lease) end
end
if renewals > 0 then redis.call('HINCRBY', KEYS[1], 'livenessRevision', 1) end
for i = 11 + 2 * renewals, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
release()
return {1, newrev}
"#;

/// After a slot migration: the metadata was last written on the node the slot left (its run id is stored) and is
/// read now on the node it moved to. Once the caller has checked that the stored run id is the one of a live
/// master (so no failover or restart replaced that node), this records the run id of the node the script runs
/// on, provided it is still the one `LOAD` saw and the stored one is unchanged. Run under the group's mutex.
///
/// ARGV: stored run id, current run id. Answers 1 when it wrote.
pub(super) const ADOPT_RUN_ID: &str = r#"
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
if run ~= ARGV[2] or redis.call('HGET', KEYS[1], 'runId') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'runId', run)
return 1
"#;

/// Frees the mutex if `ARGV[1]` holds it: sets it empty (no TTL) while the hash (`KEYS[2]`) exists, rather than
/// deleting it (see the module docs); deletes it when there is no hash, so a request naming a group that does not
/// exist leaves no key behind.
pub(super) const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('SET', KEYS[1], '') else redis.call('DEL', KEYS[1]) end
  return 1
end
return 0
"#;

/// Lua helpers of the group scripts: the XOR of every data field's digest (see `group_fields`), and
/// `HMGET` in chunks (Lua's `unpack` stops at a few thousand values).
pub(crate) const GROUP_HELPERS: &str = r#"
local LOG_KEEP = 64
local function is_data(n)
  local p = string.sub(n, 1, 2)
  return n == 'group' or p == 'm:' or p == 's:'
end
local function digest(n, v) return string.sub(redis.sha1hex(n .. '\n' .. v), 1, 16) end
local function xor_of(key)
  local all = redis.call('HGETALL', key)
  local hi, lo = 0, 0
  for i = 1, #all, 2 do
    if is_data(all[i]) then
      local h = redis.sha1hex(all[i] .. '\n' .. all[i + 1])
      hi = bit.bxor(hi, tonumber(string.sub(h, 1, 8), 16))
      lo = bit.bxor(lo, tonumber(string.sub(h, 9, 16), 16))
    end
  end
  return bit.tohex(hi, 8) .. bit.tohex(lo, 8)
end
-- The check of a load that skips the fields (see `StoredFields::shape`): the count of fields, then the length of
-- `group`, of the batch's members and of every shard block, each by `HSTRLEN` (O(1), no bytes copied). The block
-- lengths travel as one checksum, so the argument stays short at 65,536 shards. What a block costs is the
-- `HSTRLEN` call alone: its name is built by concatenation and the checksum by arithmetic, since formatting a
-- number (`string.format`, `table.concat` of numbers) costs as much as the call. A check that does not parse
-- never matches (read everything).
local DIGITS = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9'}
local function data_count(key, f)
  local present = 0
  for i = 1, 6 do if f[i] then present = present + 1 end end
  return redis.call('HLEN', key) - present
end
-- The blocks `s:0 .. s:<count - 1>` (without a count: up to the first missing one), and the checksum of their
-- lengths h = (h * 1000003 + length) mod (2^31 - 1), exact in Lua's doubles (below 2^52) with `math.fmod`.
local function block_lengths(key, count)
  local num, h, k = {}, 0, 0
  while not count or k < count do
    local n = k < 10 and DIGITS[k + 1] or num[math.floor(k / 10)] .. DIGITS[k % 10 + 1]
    num[k] = n
    local l = redis.call('HSTRLEN', key, 's:' .. n)
    if not count and l == 0 then break end
    h = math.fmod(h * 1000003 + l, 2147483647)
    k = k + 1
  end
  return k, h
end
local function same_shape(key, f, check, members)
  local n, head, blocks, sum, rest = string.match(check, '^len:(%d+):(%d+):(%d+):(%d+):(.*)$')
  if not n then return false end
  if data_count(key, f) ~= tonumber(n) then return false end
  if redis.call('HSTRLEN', key, 'group') ~= tonumber(head) then return false end
  local i = 0
  for l in string.gmatch(rest, '%d+') do
    i = i + 1
    if not members[i] or redis.call('HSTRLEN', key, 'm:' .. members[i]) ~= tonumber(l) then return false end
  end
  local _, h = block_lengths(key, tonumber(blocks))
  return h == tonumber(sum)
end
-- The same facts of the stored hash, for the caller to compare once it has applied a delta (it alone knows the
-- lengths the changes leave). Members are left out: the ones the delta changed were sent, and the batch's are
-- compared on the next load at this revision.
local function stored_shape(key, f)
  local k, h = block_lengths(key, nil)
  return string.format('len:%d:%d:%d:%d:', data_count(key, f), redis.call('HSTRLEN', key, 'group'), k, h)
end
local function hmget(key, names)
  local out = {}
  for i = 1, #names, 1000 do
    local chunk = {}
    for j = i, math.min(i + 999, #names) do chunk[#chunk + 1] = names[j] end
    local vals = redis.call('HMGET', key, unpack(chunk))
    for j = 1, #chunk do out[#out + 1] = vals[j] end
  end
  return out
end
"#;

/// `LOAD` of a group hash in fields: validates the header, then takes the mutex and reads as `LOAD` does, and
/// of the data: nothing while the caller's cached revision is current (checked by the count of fields and the
/// lengths of the group's, the batch's members' and every shard block's field; on ticks once a minute by the XOR
/// of every field's digest instead, so any edit outside a commit shows); the log entries after it and the fields
/// they name while they are all kept, with the count and lengths of the stored fields for the caller to compare
/// once it has applied them; everything (`HGETALL`) otherwise; the `aggregate` of a hash still in the layout
/// before fields (`schemaVersion` 1), which the section converts.
///
/// ARGV: token, ttl ms, cached revision, check (`xor:<16 hex>` on ticks, else `len:...`, see
/// `StoredFields::shape`), schema, legacy schema, layout, liveness scope, members...
pub(super) const GROUP_LOAD: &str = r#"
local f = redis.call('HMGET', KEYS[1], unpack(FIELDS))
local bad = check_hash(f, ARGV[5], ARGV[7], ARGV[6])
if bad then return {2, bad} end
local live = {}
local members = {}
if ARGV[8] == '*' then
  live = redis.call('HGETALL', KEYS[2])
elseif ARGV[8] == 'm' and #ARGV > 8 then
  members = {unpack(ARGV, 9)}
  local values = redis.call('HMGET', KEYS[2], unpack(members))
  for i, m in ipairs(members) do
    bad = check_lease(m, values[i])
    if bad then return {2, bad} end
    if values[i] then live[#live + 1] = m; live[#live + 1] = values[i] end
  end
end
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= '' and holder ~= ARGV[1] then return {0, holder} end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
local t = redis.call('TIME')
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
local kind, data, shape = '', {}, ''
if f[1] then
  if f[3] == ARGV[6] then
    kind = 'aggregate'
    data = {redis.call('HGET', KEYS[1], 'aggregate') or ''}
  elseif f[1] == ARGV[3] then
    kind = 'hit'
    local want = string.match(ARGV[4], '^xor:(%x+)$')
    if want and xor_of(KEYS[1]) ~= want then kind = 'full' end
    if not want and not same_shape(KEYS[1], f, ARGV[4], members) then kind = 'full' end
  else
    kind = 'full'
    local from, to = tonumber(ARGV[3]), tonumber(f[1])
    if from and to > from and to - from <= LOG_KEEP then
      local names = {}
      for r = from + 1, to do names[#names + 1] = 'log:' .. string.format('%d', r) end
      local logs = redis.call('HMGET', KEYS[1], unpack(names))
      local wanted, seen = {}, {}
      kind = 'delta'
      for i = 1, #names do
        if not logs[i] then kind = 'full'; break end
        data[#data + 1] = names[i]
        data[#data + 1] = logs[i]
        for w in string.gmatch(logs[i], '%S+') do
          local n = string.match(w, '^%-?(.*)$')
          if not seen[n] then seen[n] = true; wanted[#wanted + 1] = n end
        end
      end
      if kind == 'delta' then
        local vals = hmget(KEYS[1], wanted)
        for i = 1, #wanted do data[#data + 1] = wanted[i]; data[#data + 1] = vals[i] end
        shape = stored_shape(KEYS[1], f)
      end
    end
  end
  if kind == 'full' then data = redis.call('HGETALL', KEYS[1]) end
end
return {1, t[1], t[2], f[1] or '', f[2] or '0', f[3] or '', f[4] or '', kind, data, live, f[5] or '', run,
  redis.call('EXISTS', KEYS[2]), shape}
"#;

/// `COMMIT` of a group hash in fields: validates everything it reads or overwrites (header, revisions, run id,
/// the digest of every field it overwrites or deletes, or the aggregate it converts), then writes the changed
/// fields stamped with the new revision, the revision's log entry (dropping the one [`LOG_KEEP`] back), and the
/// liveness renewals. A corrupt hash answers `{2, why}` with nothing written and the mutex released.
///
/// ARGV: token, expected revision, expected liveness revision, schema, legacy schema, layout, updatedAt, runId,
/// SHA-1 of the aggregate converted (or empty), field count n, n x (name, expected digest or empty, `s` or `d`,
/// JSON), renewal count, (member, lease)..., forgotten members...
pub(super) const GROUP_COMMIT: &str = r#"
local function release()
  if redis.call('GET', KEYS[3]) ~= ARGV[1] then return end
  if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('SET', KEYS[3], '') else redis.call('DEL', KEYS[3]) end
end
local function corrupt(why)
  release()
  return {2, why}
end
local f = redis.call('HMGET', KEYS[1], unpack(FIELDS))
local bad = check_hash(f, ARGV[4], ARGV[6], ARGV[5])
if bad then return corrupt(bad) end
local rev = f[1] or ''
local n = tonumber(ARGV[10])
local writes = n > 0
if rev ~= ARGV[2] or (writes and (f[2] or '0') ~= ARGV[3]) then
  release()
  return {0, rev}
end
if writes and ARGV[8] ~= '' and (string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or '') ~= ARGV[8] then
  release()
  return {0, rev}
end
if rev == '' and redis.call('EXISTS', KEYS[1]) == 1 then
  return corrupt('the hash exists without a revision')
end
local converting = ARGV[9] ~= ''
if writes and rev ~= '' then
  if converting then
    local stored = redis.call('HGET', KEYS[1], 'aggregate')
    if f[3] ~= ARGV[5] or not stored or redis.sha1hex(stored) ~= ARGV[9] then
      return corrupt('the aggregate is not the one this decision read')
    end
  elseif f[3] ~= ARGV[4] then
    return corrupt('the hash is not in the layout this decision read')
  end
end
for i = 0, n - 1 do
  local name, expect = ARGV[11 + 4 * i], ARGV[12 + 4 * i]
  local cur = redis.call('HGET', KEYS[1], name)
  local same
  if converting or expect == '' then same = not cur else same = cur and digest(name, cur) == expect end
  if not same then return corrupt('field ' .. quote(name) .. ' is not the one this decision read') end
end
local base = 11 + 4 * n
local renewals = tonumber(ARGV[base])
local current = {}
for i = 0, renewals - 1 do
  local m = ARGV[base + 1 + 2 * i]
  local v = redis.call('HGET', KEYS[2], m)
  bad = check_lease(m, v)
  if bad then return corrupt(bad) end
  current[i] = tonumber(v or '0')
end
local newrev = rev
if writes then
  newrev = redis.call('HINCRBY', KEYS[1], 'revision', 1)
  local stamp = string.format('%d', newrev)
  local log = {}
  for i = 0, n - 1 do
    local name = ARGV[11 + 4 * i]
    if ARGV[13 + 4 * i] == 's' then
      redis.call('HSET', KEYS[1], name, stamp .. ':' .. ARGV[14 + 4 * i])
      log[#log + 1] = name
    else
      redis.call('HDEL', KEYS[1], name)
      log[#log + 1] = '-' .. name
    end
  end
  redis.call('HSET', KEYS[1], 'log:' .. stamp, table.concat(log, ' '))
  if newrev > LOG_KEEP then redis.call('HDEL', KEYS[1], 'log:' .. string.format('%d', newrev - LOG_KEEP)) end
  if converting then redis.call('HDEL', KEYS[1], 'aggregate') end
  redis.call('HSET', KEYS[1], 'schemaVersion', ARGV[4], 'layoutVersion', ARGV[6], 'updatedAt', ARGV[7],
    'runId', ARGV[8])
end
for i = 0, renewals - 1 do
  local m, lease = ARGV[base + 1 + 2 * i], ARGV[base + 2 + 2 * i]
  if tonumber(lease) > current[i] then redis.call('HSET', KEYS[2], m, lease) end
end
if renewals > 0 then redis.call('HINCRBY', KEYS[1], 'livenessRevision', 1) end
for i = base + 1 + 2 * renewals, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
release()
return {1, newrev}
"#;

/// The sources of the store's scripts as [`Store`] runs them: `LOAD` and `COMMIT` (each after the shared field
/// checks), then `RELEASE`. Not part of the API: for the Redis Cluster slot test (issue 15), which runs them
/// through a cluster connection.
#[doc(hidden)]
pub fn script_sources() -> [(&'static str, String); 5] {
    [
        ("LOAD", format!("{FIELD_CHECKS}{LOAD}")),
        ("COMMIT", format!("{FIELD_CHECKS}{COMMIT}")),
        ("RELEASE", RELEASE.to_owned()),
        ("GROUP_LOAD", format!("{FIELD_CHECKS}{GROUP_HELPERS}{GROUP_LOAD}")),
        ("GROUP_COMMIT", format!("{FIELD_CHECKS}{GROUP_HELPERS}{GROUP_COMMIT}")),
    ]
}
