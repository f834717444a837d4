#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test (unit, property, integration against real redis-server
# processes the tests start themselves on free loopback ports), and doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server is not on PATH. Install it (Debian/Ubuntu: apt-get install -y redis-server) or set" >&2
  echo "REDIS_SERVER_BIN to its path; the tests start their own servers on free ports." >&2
  exit 1
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
# Default features are all features of the SDKs (`metrics`), so this run and the tests below cover them.
cargo clippy --workspace --all-targets -- -D warnings
echo "== SDKs with no features (metrics off)"
cargo clippy -p redis-stream-consumer -p redis-stream-producer --all-targets --no-default-features -- -D warnings
echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi
echo "== doc tests"
cargo test --workspace --doc
echo "== OpenAPI conformance (schemathesis against the debug coord-server)"
# The tests above built it already; this only makes sure when they were skipped.
cargo build -p redis-stream-coord-server --bin coord-server
scripts/schemathesis.sh
