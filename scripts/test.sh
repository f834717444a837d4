#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test (unit, property, integration against real redis-server
# processes the tests start themselves on free loopback ports), doc tests, the script checks and the packaging
# check. Every step runs, also after one failed, and the run ends with one verdict line.
#
#   scripts/test.sh            everything this machine can run; what it cannot is skipped and said in one line
#   scripts/test.sh --quick    the tests only: no fmt, clippy, doc tests, script checks or packaging
#   scripts/test.sh --strict   a skipped step fails the run (CI: .ci/run)
#
# Environment:
#   TEST_SH_ONLY=fmt,maps      run only these steps (comma-separated, in any order; they still run in the order
#                              below): fmt maps shape clippy tests doc-tests package schemathesis script-cost
#                              status-page no-redis. Steps left out are not run and not named in the verdict.
#                              Not together with --quick (which is TEST_SH_ONLY=tests).
#   CHROMIUM_BIN               the browser of the status-page step (default chromium).
#
# A failing test runs once more (`.config/nextest.toml`); one that passes then counts as passed and is named as
# flaky in the verdict ("tests ok (936 passed, 1 flaky; flaky: crate::binary::test)").
# The verdict is the last line, printed once, on stdout:
#   test.sh: PASS in 21 min 15 s: fmt ok, maps ok, ..., tests ok (888 passed, 1 skipped), doc tests ok (25 passed), ...
#   test.sh: FAIL in 16 min 17 s: fmt ok, ..., tests FAIL (887 passed, 1 failed: stream-producer::routing::a_test), ...
# Each step's result is `<step> ok`, `<step> FAIL` or `<step> skipped (<command that gets its tool>)`, separated
# by ", " outside parentheses. The tests and doc tests name their counts and, when some failed, the failing tests
# (`<binary>::<test>`; at most 10, then "and N more"); the runner's own output, nextest's summary included, stays
# above it.
#
# Exit status:
#   0  every step that ran passed (skipped steps allowed, unless --strict)
#   1  a step failed, or with --strict a step was skipped
#   2  bad usage, or no redis-server can be provided (scripts/ensure-redis.sh failed; the verdict says so)
#
# It provides what it needs the way the demo provides Redis: a missing redis-server comes from
# scripts/ensure-redis.sh; the tools of the script checks (valgrind, chromium, python3 with venv, curl) are
# installed from the Debian packages when this runs as root or with passwordless sudo. A tool that cannot be
# provided skips only the step that needs it: `test.sh: skipped ...` names the step and the command that gets the
# tool (said at once, before anything runs, so that --strict's failure is known in seconds).
#
# No `set -e`: a failing step must not stop the steps after it; each step's status is taken explicitly.
set -uo pipefail
cd "$(dirname "$0")/.."

ALL_STEPS=(fmt maps shape clippy tests doc-tests package schemathesis script-cost status-page no-redis)
# At most this many failing tests are named in the verdict.
MAX_NAMES=10

usage() {
  echo "usage: scripts/test.sh [--quick] [--strict]   (TEST_SH_ONLY=step,step,... runs a subset;" \
    "steps: ${ALL_STEPS[*]})" >&2
  exit 2
}

quick=false
strict=false
for arg in "$@"; do
  case "$arg" in
    --quick) quick=true ;;
    --strict) strict=true ;;
    *) usage ;;
  esac
done

selected=("${ALL_STEPS[@]}")
if [ -n "${TEST_SH_ONLY:-}" ]; then
  $quick && { echo "test.sh: --quick and TEST_SH_ONLY exclude each other" >&2; usage; }
  IFS=, read -r -a wanted <<<"$TEST_SH_ONLY"
  for w in "${wanted[@]}"; do
    [[ " ${ALL_STEPS[*]} " == *" $w "* ]] || { echo "test.sh: unknown step '$w' in TEST_SH_ONLY" >&2; usage; }
  done
  selected=()
  for s in "${ALL_STEPS[@]}"; do
    [[ " ${wanted[*]} " == *" $s "* ]] && selected+=("$s")
  done
elif $quick; then
  selected=(tests)
fi

is_selected() {
  [[ " ${selected[*]} " == *" $1 "* ]]
}

started=$(date +%s)
# One entry per step that ran or was skipped, in order: "<step> ok", "<step> FAIL (...)", "<step> skipped (...)".
results=()
failed=false
skipped=()
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
trap 'echo "test.sh: interrupted" >&2; exit 130' INT TERM

elapsed() {
  local s=$(($(date +%s) - started))
  echo "$((s / 60)) min $((s % 60)) s"
}

# record STEP STATUS [DETAIL]: STATUS is 0 (ok) or anything else (FAIL).
record() {
  local step=$1 status=$2 detail=${3:-}
  local word=ok
  if [ "$status" != 0 ]; then
    word=FAIL
    failed=true
  fi
  results+=("$step $word${detail:+ ($detail)}")
}

# verdict [REASON]: prints the one verdict line. REASON replaces the step list when the run could not start.
verdict() {
  local word=PASS line
  if $failed || { $strict && [ "${#skipped[@]}" -gt 0 ]; }; then word=FAIL; fi
  if [ -n "${1:-}" ]; then
    word=FAIL
    line=$1
  else
    line=$(printf '%s\n' "${results[@]}" | awk 'NF { printf "%s%s", (n++ ? ", " : ""), $0 }')
  fi
  echo "test.sh: $word in $(elapsed): ${line:-no step selected}"
  [ "$word" = PASS ]
}

# What the runner printed in LOG, as "<passed> passed[, <failed> failed][, <n> skipped]", and the failing tests one
# a line in the file FAILS. nextest: its `Summary [...] N tests run: P passed, F failed, S skipped` line and its
# `FAIL [ 1.234s] (3/888) crate::binary test` lines (TIMEOUT and SIG... too; a `TRY n FAIL` that passed later is a
# flaky pass, not named). libtest (`cargo test`): the sum of its `test result:` lines, and its `test x ... FAILED`
# lines prefixed by the binary of the `Running`/`Doc-tests` line above them.
summarize() {
  local log=$1 fails=$2
  local summary
  summary=$(grep -E '^ *Summary \[' "$log" | tail -1)
  if [ -n "$summary" ]; then
    awk '
      /^ *(FAIL|TIMEOUT|SIG[A-Z]+|ABORT|LEAK-FAIL) +\[/ {
        sub(/^ *[A-Z-]+ +\[[^]]*\] +/, "")
        sub(/^\([0-9]+\/[0-9]+\) +/, "")
        if (NF >= 2) { name = $1 "::" $2 } else { name = $1 }
        if (!seen[name]++) print name
      }' "$log" >"$fails"
    echo "$summary" | awk '{
      line = $0; out = ""; passed = 0; failed = 0; skipped = 0
      if (match(line, /[0-9]+ passed/)) passed = substr(line, RSTART, RLENGTH) + 0
      while (match(line, /[0-9]+ (failed|timed out)/)) { failed += substr(line, RSTART, RLENGTH) + 0; line = substr(line, RSTART + RLENGTH) }
      line = $0
      if (match(line, /[0-9]+ skipped/)) skipped = substr(line, RSTART, RLENGTH) + 0
      out = passed " passed"
      if (failed) out = out ", " failed " failed"
      if (skipped) out = out ", " skipped " skipped"
      if (match(line, /[0-9]+ flaky/)) out = out ", " substr(line, RSTART, RLENGTH) + 0 " flaky"
      print out
    }'
    # Passed on a retry (`.config/nextest.toml`): named, so a flake is seen, not only counted.
    flaky=$(awk '/^ *FLAKY +[0-9]+\/[0-9]+ +\[/ {
        sub(/^ *FLAKY +[0-9]+\/[0-9]+ +\[[^]]*\] +/, ""); sub(/^\([0-9]+\/[0-9]+\) +/, "")
        name = (NF >= 2) ? $1 "::" $2 : $1; if (!seen[name]++) printf "%s%s", (n++ ? ", " : ""), name
      }' "$log")
    [ -n "$flaky" ] && echo "flaky: $flaky" >>"$fails.flaky"
    return
  fi
  awk -v fails="$fails" '
    /^ *Running / { bin = $NF; gsub(/[()]/, "", bin); sub(/.*\//, "", bin); sub(/-[0-9a-f]+$/, "", bin) }
    /^ *Doc-tests / { bin = $2 }
    /^test .* \.\.\. FAILED$/ {
      name = $0
      sub(/^test /, "", name); sub(/ \.\.\. FAILED$/, "", name)
      # A doc test is named "<file> - <item> (line N)": keep "<file>:N", which has no spaces or parentheses.
      if (match(name, / - .*\(line [0-9]+\)$/)) {
        line = substr(name, RSTART); sub(/.*\(line /, "", line); sub(/\)$/, "", line)
        name = substr(name, 1, RSTART - 1) ":" line
      }
      name = bin "::" name
      if (!seen[name]++) print name > fails
    }
    /^test result: / {
      for (i = 1; i <= NF; i++) {
        if ($(i) ~ /^passed/) passed += $(i - 1)
        if ($(i) ~ /^failed/) failed += $(i - 1)
        if ($(i) ~ /^ignored/) skipped += $(i - 1)
      }
      results++
    }
    END {
      close(fails)
      if (!results) { print "no test summary: the build failed or the runner stopped, see above"; exit }
      out = passed + 0 " passed"
      if (failed) out = out ", " failed " failed"
      if (skipped) out = out ", " skipped " skipped"
      print out
    }' "$log"
  : >>"$fails"
}

# names FILE: the failing tests of FILE on one line, at most MAX_NAMES, then "and N more".
names() {
  awk -v max="$MAX_NAMES" '
    NF { n++; if (n <= max) out = out (n > 1 ? ", " : "") $0 }
    END { if (n > max) out = out " and " (n - max) " more"; printf "%s", out }' "$1"
}

# test_step STEP COMMAND...: runs a test runner, keeps its whole output, and records the counts and failures.
test_step() {
  local step=$1
  shift
  local fails status counts detail
  fails="$(mktemp)"
  "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  counts=$(summarize "$log" "$fails")
  detail=$counts
  if [ -s "$fails" ]; then
    detail="$counts: $(names "$fails")"
    # Failing tests named: the step failed whatever the runner's exit status claims.
    [ "$status" = 0 ] && status=1
  fi
  if [ -s "$fails.flaky" ]; then
    detail="$detail; $(cat "$fails.flaky")"
  fi
  rm -f "$fails" "$fails.flaky"
  record "$step" "$status" "$detail"
}

run_tests() {
  if cargo nextest --version >/dev/null 2>&1; then
    test_step tests cargo nextest run --workspace --no-fail-fast
  else
    test_step tests cargo test --workspace --no-fail-fast
  fi
}

# step STEP COMMAND...: runs one command and records whether it passed.
step() {
  local step=$1
  shift
  "$@"
  record "$step" $?
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

# needs STEP HOW CHECK PACKAGE...: whether STEP (when selected) can run; when it cannot, records it as skipped
# with HOW (the command that gets the tool).
needs() {
  local step=$1 how=$2
  shift 2
  is_selected "$step" || return 1
  if provide "$@"; then return 0; fi
  skipped+=("$step ($how)")
  return 1
}

skipped_line() {
  printf '%s\n' "${skipped[@]}" | awk 'NF { printf "%s%s", (n++ ? "; " : ""), $0 }'
}

# record_skip STEP: when STEP was skipped, its place in the verdict says so.
record_skip() {
  local s
  for s in "${skipped[@]}"; do
    [[ "$s" == "$1 ("* ]] && results+=("$1 skipped ${s#"$1 "}")
  done
  return 0
}

# Only the tests and the script checks start redis-server.
for s in tests doc-tests schemathesis script-cost status-page; do
  if is_selected "$s"; then
    if ! REDIS_SERVER_BIN="$(scripts/ensure-redis.sh)"; then
      verdict "no redis-server could be provided (scripts/ensure-redis.sh, above)"
      exit 2
    fi
    export REDIS_SERVER_BIN
    break
  fi
done

# Every tool is provided (or found missing) before anything runs, so that a missing one is known in seconds.
# Their skips take their step's place in the verdict below.
is_selected schemathesis || is_selected script-cost || is_selected status-page || is_selected no-redis &&
  echo "== tools of the script checks"
can_schemathesis=false can_script_cost=false can_status_page=false can_no_redis=false
needs schemathesis "apt-get install python3 python3-venv curl" \
  'command -v curl && python3 -c "import venv, ensurepip"' python3 python3-venv curl && can_schemathesis=true
needs script-cost "apt-get install valgrind" 'command -v valgrind' valgrind && can_script_cost=true
CHROMIUM_BIN=${CHROMIUM_BIN:-chromium}
export CHROMIUM_BIN
needs status-page "apt-get install chromium, or set CHROMIUM_BIN" \
  'command -v "$CHROMIUM_BIN" && command -v curl && command -v python3' chromium curl python3 && can_status_page=true
needs no-redis "apt-get install python3-pip" \
  'python3 -m pip --version || command -v pip3 || command -v pip' python3-pip && can_no_redis=true
if [ "${#skipped[@]}" -gt 0 ]; then
  echo "test.sh: skipped $(skipped_line)" >&2
  if $strict; then
    echo "test.sh: --strict: the run will FAIL for the skipped step(s); the other steps still run" >&2
  fi
fi

if is_selected fmt; then
  echo "== cargo fmt --check"
  step fmt cargo fmt --all -- --check
fi
if is_selected maps; then
  echo "== documents name only files and tests that exist"
  step maps python3 scripts/check-doc-paths.py
fi
if is_selected shape; then
  echo "== shape: file sizes and long functions"
  step shape scripts/check-shape.sh
fi
if is_selected clippy; then
  echo "== cargo clippy -D warnings"
  # Default features are all features of the SDKs (`metrics`), so this run and the tests below cover them.
  cargo clippy --workspace --all-targets -- -D warnings
  clippy_all=$?
  echo "== SDKs with no features (metrics off)"
  # Not a repeat of the run above: within the workspace, features unify, so the SDKs are only ever linted with
  # `metrics` on there. This run lints the code compiled when `metrics` is off (its cfg branches and imports).
  cargo clippy -p stream-consumer -p stream-producer --all-targets --no-default-features -- -D warnings
  clippy_none=$?
  record clippy $((clippy_all | clippy_none))
fi
if is_selected tests; then
  echo "== tests"
  run_tests
fi
if is_selected doc-tests; then
  echo "== doc tests"
  test_step "doc tests" cargo test --workspace --doc
  echo "== docs.rs pages: an example on >= 90 % of the SDKs' pages, no warning, no foreign error type"
  step doc-examples python3 scripts/check-doc-examples.py
fi
if is_selected package; then
  echo "== packaging (cargo package of every crate meant for a registry)"
  step package scripts/check-package.sh
fi
record_skip schemathesis
if $can_schemathesis; then
  echo "== OpenAPI conformance (schemathesis against the debug coord-server)"
  # The tests above built it already; this only makes sure when they were skipped or not selected.
  if cargo build -p coord-server --bin coord-server; then
    step schemathesis scripts/schemathesis.sh
  else
    record schemathesis 1 "coord-server did not build"
  fi
fi
record_skip script-cost
if $can_script_cost; then
  echo "== publish script cost (callgrind instruction counts, deterministic)"
  step script-cost scripts/script-cost.sh --check
fi
record_skip status-page
if $can_status_page; then
  echo "== status page in headless Chromium"
  step status-page scripts/check-status-page.sh
fi
record_skip no-redis
if $can_no_redis; then
  echo "== fresh machine: no redis-server on PATH"
  step no-redis scripts/check-no-redis.sh
fi

if [ "${#skipped[@]}" -gt 0 ]; then
  echo "test.sh: skipped $(skipped_line)"
fi
if verdict; then exit 0; fi
exit 1
