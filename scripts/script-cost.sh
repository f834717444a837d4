#!/usr/bin/env bash
# Redis CPU of the producer's publish script against plain pipelined XADD, counted in instructions, not seconds:
# every figure comes from a private redis-server run under `valgrind --tool=callgrind`, so it is the same on a
# busy and on an idle machine (the timed benchmark, producer_bench, is noisy on 2 shared cores).
#
#   scripts/script-cost.sh            # 64,000 records of 100 B per variant, about a minute (seven variants)
#   scripts/script-cost.sh --check    # the same, and fails if a variant falls below its floor (scripts/test.sh):
#                                     # fenced >= 0.66, idem >= 0.62 of native (measured 0.685 and 0.643;
#                                     # SCRIPT_COST_FLOOR_FENCED / _IDEM override the floors)
#
# Variants, the same 64,000 one-field records each:
#   native  redis-benchmark XADD, pipelines of 32, 8 connections (what a raw XADD loop costs Redis)
#   floor   the smallest Lua loop that XADDs a batch (no checks, no answer): what any script costs at least
#   fenced  the SDK's publish script (stream-producer/src/publish_script.rs), 128 records per call
#   idem    the same script with idempotence on (the state is written by every call)
#   pipe    plain XADD again, but sent like the two below: one connection, `redis-cli --pipe` (their baseline)
#   multi   MULTI, 128 plain XADDs, EXEC (a transaction with no check at all)
#   watch   WATCH fence, HMGET fence (fence, birth, their counts), MULTI, 128 plain XADDs, EXEC: the cost to Redis of a fence checked by the
#           client between WATCH and EXEC (the transaction design of BENCHMARKS.md, issue 17; not what the SDK
#           sends)
# Prints instructions per record and native / variant (the share of a raw loop's rate the variant can reach
# when Redis is the bottleneck). Needs valgrind, redis-server, redis-benchmark and redis-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
check=false
case "${1:-}" in
  --check) check=true ;;
  "") ;;
  *) echo "usage: scripts/script-cost.sh [--check]" >&2; exit 2 ;;
esac
redis_server="${REDIS_SERVER_BIN:-redis-server}"
for tool in valgrind "$redis_server" redis-benchmark redis-cli; do
  command -v "$tool" >/dev/null || { echo "script-cost.sh: $tool is missing" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
awk '/^const LUA: &str = r#"$/{on=1; next} /^"#;$/{on=0} on' stream-producer/src/publish_script.rs >"$work/publish.lua"
[ -s "$work/publish.lua" ] || { echo "script-cost.sh: the publish script was not found" >&2; exit 1; }
echo "local c=redis.call local k=KEYS[1] local A=ARGV for i=11,#A,2 do c('XADD',k,'*',A[i],A[i+1]) end return 1" \
  >"$work/floor.lua"

records=64000
per_call=128
# The RESP streams of the pipe, multi and watch variants.
python3 - "$work" "$records" "$per_call" <<'PY'
import sys
work, records, per_call = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def cmd(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)
xadd = cmd("XADD", "{s}:stream", "*", "p", b"x" * 100)
batch = xadd * per_call
calls = records // per_call
with open(f"{work}/pipe.resp", "wb") as f:
    f.write(batch * calls)
with open(f"{work}/multi.resp", "wb") as f:
    f.write((cmd("MULTI") + batch + cmd("EXEC")) * calls)
with open(f"{work}/watch.resp", "wb") as f:
    check = cmd("WATCH", "{s}:fence") + cmd("HMGET", "{s}:fence", "routingVersion", "bornVersion", "fenceCount", "bornCount")
    f.write((check + cmd("MULTI") + batch + cmd("EXEC")) * calls)
PY
calls=$((records / per_call))
payload="$(head -c 100 /dev/zero | tr '\0' x)"
fields=()
for _ in $(seq 1 "$per_call"); do fields+=(p "$payload"); done

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Runs one variant under callgrind and prints the instructions it cost.
measure() {
  local variant="$1" port out
  port="$(free_port)"
  out="$work/callgrind.$variant"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$redis_server" --port "$port" --bind 127.0.0.1 \
    --save "" --appendonly no >/dev/null 2>&1 &
  local pid=$!
  local deadline=$((SECONDS + 60))
  until redis-cli -p "$port" ping >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "script-cost.sh: redis-server did not start" >&2; exit 1; }
    sleep 0.2
  done
  local keys=('{s}:stream' '{s}:fence' '{s}:seq')
  local record=(routingVersion 5 fenceCount 4 bornVersion 1 bornCount 2)
  case "$variant" in
    empty) ;;
    native) redis-benchmark -p "$port" -n "$records" -P 32 -c 8 -q XADD '{s}:stream' '*' p "$payload" >/dev/null ;;
    floor)
      sha="$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/floor.lua")")"
      redis-benchmark -p "$port" -n "$calls" -c 8 -q EVALSHA "$sha" 3 "${keys[@]}" 5 '' '' '' '' 0 0 "$per_call" 1 1 \
        "${fields[@]}" >/dev/null ;;
    fenced)
      # The shard's record, as the coordinator writes it for a sealed parent: the call checks the fence, the
      # birth and both layouts' shard counts against its routing's 4 shards (the last header argument, issue 30).
      redis-cli -p "$port" HSET '{s}:fence' "${record[@]}" >/dev/null
      sha="$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/publish.lua")")"
      redis-benchmark -p "$port" -n "$calls" -c 8 -q EVALSHA "$sha" 3 "${keys[@]}" 5 '' '' '' '' 0 0 "$per_call" 1 4 \
        "${fields[@]}" >/dev/null ;;
    idem)
      # A new epoch per call (redis-benchmark replaces __rand_int__): every call writes the state.
      redis-cli -p "$port" HSET '{s}:fence' "${record[@]}" >/dev/null
      sha="$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/publish.lua")")"
      redis-benchmark -p "$port" -n "$calls" -c 8 -r 100000000 -q EVALSHA "$sha" 3 "${keys[@]}" 5 '' '' 0 \
        e__rand_int__ 0 60000 "$per_call" 1 4 "${fields[@]}" >/dev/null ;;
    pipe | multi | watch) redis-cli -p "$port" --pipe <"$work/$variant.resp" >/dev/null ;;
  esac
  if [ "$variant" != empty ]; then
    local len
    len="$(redis-cli -p "$port" XLEN '{s}:stream')"
    [ "$len" = "$records" ] || { echo "script-cost.sh: $variant wrote $len of $records records" >&2; exit 1; }
  fi
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  awk '/^summary:/{print $2}' "$out"
}

empty="$(measure empty)"
native="$(measure native)"
printf '%-8s %14s %10s\n' variant instr/record "native/x"
printf '%-8s %14d %10s\n' native $(((native - empty) / records)) 1.000
declare -A floor_of=([fenced]="${SCRIPT_COST_FLOOR_FENCED:-0.66}" [idem]="${SCRIPT_COST_FLOOR_IDEM:-0.62}")
failed=""
for v in floor fenced idem pipe multi watch; do
  total="$(measure "$v")"
  per=$(((total - empty) / records))
  ratio="$(awk -v n="$native" -v e="$empty" -v t="$total" 'BEGIN { printf "%.6f", (n - e) / (t - e) }')"
  printf '%-8s %14d %10.3f\n' "$v" "$per" "$ratio"
  min="${floor_of[$v]:-}"
  if [ -n "$min" ] && awk -v r="$ratio" -v m="$min" 'BEGIN { exit !(r < m) }'; then
    failed="$failed $v ($(printf '%.3f' "$ratio") < $min)"
  fi
done
if $check && [ -n "$failed" ]; then
  echo "script-cost.sh: FAIL: the publish script costs Redis more than its floor allows:$failed" >&2
  exit 1
fi
