#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test (unit, property, integration against real redis-server
# processes the tests start themselves on free loopback ports), doc tests, the script checks and the packaging
# check. Ends with one verdict line.
#
#   scripts/test.sh            everything this machine can run; what it cannot is skipped and said in one line
#   scripts/test.sh --quick    the tests only: no fmt, clippy, doc tests, script checks or packaging
#   scripts/test.sh --strict   a skipped step fails the run (CI: .ci/run)
#
# It provides what it needs the way the demo provides Redis: a missing redis-server comes from
# scripts/ensure-redis.sh; the tools of the script checks (valgrind, chromium, python3 with venv, curl) are
# installed from the Debian packages when this runs as root or with passwordless sudo. A tool that cannot be
# provided skips only the step that needs it: `test.sh: skipped ...` names the step and the command that gets the
# tool, and the run still passes, unless --strict.
set -Eeuo pipefail
cd "$(dirname "$0")/.."

quick=false
strict=false
for arg in "$@"; do
  case "$arg" in
    --quick) quick=true ;;
    --strict) strict=true ;;
    *) echo "usage: scripts/test.sh [--quick] [--strict]" >&2; exit 2 ;;
  esac
done
started=$(date +%s)
done_steps=()
skipped=()
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
trap 'echo "test.sh: FAIL (passed before the failure: $(steps)) in $(elapsed)" >&2' ERR

steps() {
  local IFS=';'
  echo "${done_steps[*]:-nothing}" | sed 's/;/, /g'
}

elapsed() {
  local s=$(($(date +%s) - started))
  echo "$((s / 60)) min $((s % 60)) s"
}

# Counts what the runner printed: nextest's "N tests run", or the sum of libtest's "N passed".
count_tests() {
  local n
  n=$(grep -Eo '[0-9]+ tests? run' "$log" | tail -1 | grep -Eo '^[0-9]+' || true)
  if [ -z "$n" ]; then
    n=$(grep -Eo 'test result: ok\. [0-9]+ passed' "$log" | grep -Eo '[0-9]+' | awk '{ s += $1 } END { print s + 0 }')
  fi
  echo "${n:-0}"
}

run_tests() {
  if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast 2>&1 | tee "$log"
  else
    cargo test --workspace --no-fail-fast 2>&1 | tee "$log"
  fi
  done_steps+=("$(count_tests) tests")
}

# `sudo -n` when not root and sudo needs no password, empty as root; fails when neither.
privileged() {
  if [ "$(id -u)" = 0 ]; then
    echo ""
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    echo "sudo -n"
  else
    return 1
  fi
}

apt_updated=false
# provide CHECK PACKAGE...: runs CHECK (a shell condition); when it fails, installs the Debian PACKAGEs if this
# user may, and runs CHECK again. Says what it does on stderr.
provide() {
  local check=$1
  shift
  if eval "$check" >/dev/null 2>&1; then return 0; fi
  local sudo
  if ! command -v apt-get >/dev/null 2>&1 || ! sudo=$(privileged); then
    return 1
  fi
  echo "test.sh: installing the Debian package(s) $* (${sudo:-as root})" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! $apt_updated; then
    $sudo apt-get update -qq >&2 || true
    apt_updated=true
  fi
  $sudo apt-get install -y -qq --no-install-recommends "$@" >&2 || return 1
  eval "$check" >/dev/null 2>&1
}

# needs STEP HOW CHECK PACKAGE...: whether STEP can run; when it cannot, records it as skipped with HOW (the
# command that gets the tool).
needs() {
  local step=$1 how=$2
  shift 2
  if provide "$@"; then return 0; fi
  skipped+=("$step ($how)")
  return 1
}

skipped_line() {
  local IFS=';'
  echo "${skipped[*]}" | sed 's/;/; /g'
}

REDIS_SERVER_BIN="$(scripts/ensure-redis.sh)"
export REDIS_SERVER_BIN

if $quick; then
  echo "== tests (quick mode)"
  run_tests
  echo "test.sh: PASS (quick: $(steps)) in $(elapsed)"
  exit 0
fi

# Every tool is provided (or found missing) before anything runs, so that --strict fails in seconds, not after
# the tests.
echo "== tools of the script checks"
can_schemathesis=false can_script_cost=false can_status_page=false can_no_redis=false
needs schemathesis "apt-get install python3 python3-venv curl" \
  'command -v curl && python3 -c "import venv, ensurepip"' python3 python3-venv curl && can_schemathesis=true
needs script-cost "apt-get install valgrind" 'command -v valgrind' valgrind && can_script_cost=true
CHROMIUM_BIN=${CHROMIUM_BIN:-chromium}
export CHROMIUM_BIN
needs status-page "apt-get install chromium, or set CHROMIUM_BIN" \
  'command -v "$CHROMIUM_BIN" && command -v curl && command -v python3' chromium curl python3 && can_status_page=true
needs no-redis-check "apt-get install python3-pip" \
  'python3 -m pip --version || command -v pip3 || command -v pip' python3-pip && can_no_redis=true
if [ "${#skipped[@]}" -gt 0 ]; then
  echo "test.sh: skipped $(skipped_line)" >&2
  if $strict; then
    echo "test.sh: FAIL (--strict: a step cannot run here: $(skipped_line)) in $(elapsed)" >&2
    exit 1
  fi
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
done_steps+=(fmt)
echo "== documents name only files and tests that exist"
python3 scripts/check-doc-paths.py
done_steps+=(maps)
echo "== shape: file sizes and long functions"
scripts/check-shape.sh
done_steps+=(shape)
echo "== cargo clippy -D warnings"
# Default features are all features of the SDKs (`metrics`), so this run and the tests below cover them.
cargo clippy --workspace --all-targets -- -D warnings
echo "== SDKs with no features (metrics off)"
# Not a repeat of the run above: within the workspace, features unify, so the SDKs are only ever linted with
# `metrics` on there. This run lints the code compiled when `metrics` is off (its cfg branches and imports).
cargo clippy -p stream-consumer -p stream-producer --all-targets --no-default-features -- -D warnings
done_steps+=(clippy)
echo "== tests"
run_tests
echo "== doc tests"
cargo test --workspace --doc 2>&1 | tee "$log"
done_steps+=("$(count_tests) doc tests")
echo "== packaging (cargo package of every crate meant for a registry)"
scripts/check-package.sh
done_steps+=(package)
if $can_schemathesis; then
  echo "== OpenAPI conformance (schemathesis against the debug coord-server)"
  # The tests above built it already; this only makes sure when they were skipped.
  cargo build -p coord-server --bin coord-server
  scripts/schemathesis.sh
  done_steps+=(schemathesis)
fi
if $can_script_cost; then
  echo "== publish script cost (callgrind instruction counts, deterministic)"
  scripts/script-cost.sh --check
  done_steps+=(script-cost)
fi
if $can_status_page; then
  echo "== status page in headless Chromium"
  scripts/check-status-page.sh
  done_steps+=(status-page)
fi
if $can_no_redis; then
  echo "== fresh machine: no redis-server on PATH"
  scripts/check-no-redis.sh
  done_steps+=("no-redis check")
fi

if [ "${#skipped[@]}" -gt 0 ]; then
  echo "test.sh: skipped $(skipped_line)"
  echo "test.sh: PASS ($(steps); skipped: ${#skipped[@]}, see above) in $(elapsed)"
else
  echo "test.sh: PASS ($(steps)) in $(elapsed)"
fi
