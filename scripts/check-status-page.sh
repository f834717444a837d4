#!/usr/bin/env bash
# The status page in a real headless Chromium: starts its own redis-server and the debug coord-server (admin token
# set) on free ports, creates a group, joins two members with curl heartbeats, then loads GET /status?token= in
# Chromium (Debian's `chromium` package) and checks that the DOM Chromium built shows the group, both members and
# an owner. With --screenshot, also writes docs/status-page.png (1200x800).
#
# Uses target/debug/coord-server unless COORD_SERVER_BIN says otherwise; CHROMIUM_BIN names the browser.
set -euo pipefail
cd "$(dirname "$0")/.."

COORD_BIN=${COORD_SERVER_BIN:-${CARGO_TARGET_DIR:-target}/debug/coord-server}
REDIS_BIN=${REDIS_SERVER_BIN:-redis-server}
CHROMIUM=${CHROMIUM_BIN:-chromium}
TOKEN=status-page-token
STREAM=orders
GROUP=billing
SCREENSHOT=no
[ "${1:-}" = "--screenshot" ] && SCREENSHOT=yes

missing() {
  echo "check-status-page.sh: $*" >&2
  exit 1
}
for tool in curl python3 "$REDIS_BIN"; do
  command -v "$tool" >/dev/null 2>&1 || missing "$tool is not on PATH"
done
command -v "$CHROMIUM" >/dev/null 2>&1 || missing "$CHROMIUM is not on PATH (Debian: apt-get install -y chromium)"
[ -x "$COORD_BIN" ] || missing "$COORD_BIN is missing: run 'cargo build -p coord-server' first"

# shellcheck source=scripts/lib/scratch-coordinator.sh
. scripts/lib/scratch-coordinator.sh

deadline=$((SECONDS + 30))
until curl -fsS "$BASE/readyz" >/dev/null 2>&1; do
  [ "$SECONDS" -lt "$deadline" ] || { cat "$WORK/coordinator.log" >&2; missing "the coordinator was not ready within 30 s"; }
  sleep 0.2
done

call() {
  curl -fsS -X POST -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' -d "$2" "$BASE$1"
}
call "/v1/streams/$STREAM/groups/$GROUP" '{"shardCount": 8}' >/dev/null
# Both members join, then keep heartbeating until the check ends: a slow (cold) Chromium start must not outlast
# their lease, so the page is checked against live members rather than against the member TTL.
cat >"$WORK/members.py" <<'PY'
import json, sys, time, urllib.request
base, token, path = sys.argv[1:4]
state = {m: {"memberEpoch": 0, "metadataVersion": 0, "incarnation": 0} for m in ("worker-1", "worker-2")}
def beat(member):
    body = {"memberId": member, "instanceId": member + "-i", "maxObservedVersion": 0, "owned": [], "revoking": [],
            **state[member]}
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        resp = json.load(r)
    state[member] = {"memberEpoch": resp["memberEpoch"], "metadataVersion": resp["metadataVersion"],
                     "incarnation": resp["incarnation"]}
for m in state:
    beat(m)
print("joined", flush=True)
while True:
    time.sleep(1)
    for m in state:
        try:
            beat(m)
        except Exception as e:
            print("heartbeat failed:", m, e, file=sys.stderr, flush=True)
PY
python3 -u "$WORK/members.py" "$BASE" "$TOKEN" "/v1/streams/$STREAM/groups/$GROUP/heartbeat" >"$WORK/members.log" \
  2>&1 &
PIDS+=($!)
deadline=$((SECONDS + 30))
until grep -q joined "$WORK/members.log" 2>/dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || { cat "$WORK/members.log" >&2; missing "the members did not join within 30 s"; }
  sleep 0.2
done

browse() {
  "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$WORK/profile" "$@" "$BASE/status?token=$TOKEN"
}
browse --dump-dom >"$WORK/dom.html" 2>"$WORK/chromium.log" || { cat "$WORK/chromium.log" >&2; missing "chromium failed"; }
for needle in "$STREAM / $GROUP" '<td>worker-1</td>' '<td>worker-2</td>' '<tr class="shard'; do
  grep -qF -- "$needle" "$WORK/dom.html" || { cat "$WORK/dom.html" >&2; missing "the page lacks $needle"; }
done
if grep -q '<script' "$WORK/dom.html"; then missing "the page carries a script"; fi
if [ "$SCREENSHOT" = yes ]; then
  browse --screenshot="$PWD/docs/status-page.png" --window-size=1200,800 >/dev/null 2>>"$WORK/chromium.log" ||
    { cat "$WORK/chromium.log" >&2; missing "chromium could not take the screenshot"; }
  echo "check-status-page.sh: wrote docs/status-page.png"
fi
echo "check-status-page.sh: PASS (group, members and shard grid rendered by $("$CHROMIUM" --version 2>/dev/null | head -1))"
