#!/usr/bin/env bash
# Packages every crate meant for a registry (each crate without `publish = false`) the way `cargo publish` would,
# without publishing, then builds the packages from their .crate files alone.
#
#   scripts/check-package.sh               package, then build the packages standalone (a few minutes cold, its
#                                          own target dir target/package-check, incremental afterwards)
#   scripts/check-package.sh --no-verify   package only (seconds): versions on path dependencies, metadata, files
#   scripts/check-package.sh --list        the files each package would carry
#
# 1. `cargo package --workspace --no-verify` (cargo 1.89 and newer package workspace crates that depend on each
#    other unpublished): every path dependency must carry a version, the manifest is rewritten as a registry
#    would get it, and each package holds only its `include` list.
# 2. The .crate files are unpacked into a scratch workspace whose `[patch.crates-io]` points every package's name
#    at its unpacked copy, with the repository's Cargo.lock (the same external versions as the tests), and built:
#    each package compiles from the files it carries, against the other packages as packaged.
#
# Why not cargo's own verification (`cargo package` without --no-verify): it resolves the packages' dependencies
# on each other through the registry overlaid with the new packages, and two of our package names, `protocol`
# and `client-core`, belong to other projects on the public Rust registry with higher 0.1.x versions, which win
# the resolution (the verify build then compiles a stranger's `protocol`). Publishing therefore needs those two
# packages renamed first (e.g. package `redis-stream-coord-protocol` with `[lib] name = "protocol"`); step 2
# checks everything else.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

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

out=$(mktemp)
scratch=$(mktemp -d)
trap 'rm -rf "$out" "$scratch"' EXIT
status=0
# --allow-dirty: checks what is in the work tree, committed or not (CI's clone is clean either way).
cargo package --workspace "${excluded[@]}" --allow-dirty --locked --no-verify >"$out" 2>&1 || status=$?
# A package leaves its tests and benchmarks out (they need the workspace's test-support and real redis-servers):
# cargo names each one it ignores.
grep -v '^warning: ignoring \(test\|bench\|example\) `' "$out" || true
if [ "$status" != 0 ]; then
  echo "check-package: FAIL (cargo package exited with $status)" >&2
  exit 1
fi
if [ "$mode" = --no-verify ]; then
  echo "check-package: PASS (${#publishable[@]} crates packaged, not built: ${publishable[*]})"
  exit 0
fi

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
{
  echo '[workspace]'
  echo 'resolver = "2"'
  echo 'members = ['
  for name in "${publishable[@]}"; do echo "  \"$name-$version\","; done
  echo ']'
  echo '[patch.crates-io]'
  for name in "${publishable[@]}"; do echo "$name = { path = \"$name-$version\" }"; done
} >"$scratch/Cargo.toml"
for name in "${publishable[@]}"; do
  tar -xzf "${CARGO_TARGET_DIR:-target}/package/$name-$version.crate" -C "$scratch"
done
cp Cargo.lock "$scratch/"
echo "== building the packages from their .crate files (scratch workspace, target/package-check)"
if ! (cd "$scratch" && CARGO_TARGET_DIR="$root/target/package-check" cargo build --workspace --all-features 2>&1 |
  grep -v '^\s*Compiling '; exit "${PIPESTATUS[0]}"); then
  echo "check-package: FAIL (a package does not build from its .crate file)" >&2
  exit 1
fi
echo "check-package: PASS (${#publishable[@]} crates packaged and built standalone: ${publishable[*]})"
