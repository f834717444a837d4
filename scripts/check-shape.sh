#!/usr/bin/env bash
# The shape the code keeps (issue 32): no tracked Rust file over 800 lines, tests included, and at most 10
# functions of 80 lines or more outside tests (scripts/long-functions.py lists them). Exits 1 naming what broke.
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_LINES=800
MAX_LONG_FUNCTIONS=10
status=0

over=$(git ls-files '*.rs' | while read -r f; do
  [ -f "$f" ] || continue
  n=$(wc -l <"$f")
  [ "$n" -le "$MAX_LINES" ] || echo "$f: $n lines"
done)
if [ -n "$over" ]; then
  echo "check-shape: source files over $MAX_LINES lines (split them by concern):" >&2
  echo "$over" >&2
  status=1
fi

listing=$(python3 scripts/long-functions.py)
count=$(echo "$listing" | tail -1 | grep -Eo '^total: [0-9]+' | grep -Eo '[0-9]+')
if [ "$count" -gt "$MAX_LONG_FUNCTIONS" ]; then
  echo "check-shape: $count functions of 80 lines or more outside tests (at most $MAX_LONG_FUNCTIONS):" >&2
  echo "$listing" >&2
  status=1
fi
[ "$status" = 0 ] && echo "check-shape: no file over $MAX_LINES lines; $count long functions (at most $MAX_LONG_FUNCTIONS)"
exit "$status"
