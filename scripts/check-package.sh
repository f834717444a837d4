#!/usr/bin/env bash
# Packages every crate meant for a registry (each crate without `publish = false`) the way `cargo publish` would,
# and lets cargo verify the packages, without publishing.
#
#   scripts/check-package.sh               package and verify (cargo builds each package from its .crate file;
#                                          cold 18 min on a 2-core machine shared with other builds, 8 min of
#                                          CPU; 1-4 min once the target dir holds the dependencies' builds)
#   scripts/check-package.sh --no-verify   package only (seconds): versions on path dependencies, metadata, files
#   scripts/check-package.sh --list        the files each package would carry
#
# `cargo package --workspace` packages the workspace's crates together: every path dependency must carry a version,
# each manifest is rewritten as a registry would get it, each package holds only its `include` list. Then cargo's
# own verification unpacks each .crate file and builds it (all features) against the registry overlaid with the
# other new packages, so a package that needs a file it does not carry, or an API of a sibling that its package
# lacks, fails here. That overlay is why the packages carry names nobody else has on the public registry
# (`redis-stream-coord-protocol`, `redis-stream-coord-client-core`, libraries still `protocol` and `client_core`):
# a name taken there with a higher version would win the resolution and the verification would build a stranger's
# crate. Needs the registry's index (the dependencies' versions come from Cargo.lock, `--locked`).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in "" | --no-verify | --list) ;; *) echo "usage: scripts/check-package.sh [--no-verify|--list]" >&2; exit 2 ;; esac

excluded=()
publishable=()
for manifest in */Cargo.toml tests/*/Cargo.toml; do
  name=$(sed -n 's/^name = "\(.*\)"/\1/p' "$manifest" | head -1)
  if grep -q '^publish = false' "$manifest"; then excluded+=(--exclude "$name"); else publishable+=("$name"); fi
done
echo "check-package: ${publishable[*]}" >&2

if [ "$mode" = --list ]; then
  for name in "${publishable[@]}"; do
    echo "== $name"
    cargo package --list --allow-dirty -p "$name"
  done
  exit 0
fi

verify=(--all-features)
[ "$mode" = --no-verify ] && verify=(--no-verify)
out=$(mktemp)
trap 'rm -rf "$out"' EXIT
status=0
start=$SECONDS
# --allow-dirty: checks what is in the work tree, committed or not (CI's clone is clean either way).
cargo package --workspace "${excluded[@]}" --allow-dirty --locked "${verify[@]}" >"$out" 2>&1 || status=$?
# A package leaves its tests and benchmarks out (they need the workspace's test-support and real redis-servers):
# cargo names each one it ignores. The verification's compile lines say nothing a failure would not.
grep -v -e '^warning: ignoring \(test\|bench\|example\) `' -e '^\s*\(Compiling\|Downloaded\|Downloading\) ' "$out" || true
if [ "$status" != 0 ]; then
  echo "check-package: FAIL (cargo package exited with $status)" >&2
  exit 1
fi
if [ "$mode" = --no-verify ]; then
  echo "check-package: PASS (${#publishable[@]} crates packaged, not built: ${publishable[*]})"
else
  echo "check-package: PASS (${#publishable[@]} crates packaged and verified by cargo in $((SECONDS - start)) s: ${publishable[*]})"
fi
