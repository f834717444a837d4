#!/usr/bin/env bash
# Packages every crate meant for a registry (each crate without `publish = false`) the way `cargo publish` would,
# without publishing: versions on the workspace's path dependencies, metadata and the files each package carries.
# The workspace's crates depend on each other unpublished; `cargo package --workspace` (cargo 1.89 and newer)
# resolves them against the packages it has just made, so no registry needs to hold them first.
#
#   scripts/check-package.sh            package and verify (builds every package from its .crate, as a user
#                                       would; a few minutes, its own target dir under target/package)
#   scripts/check-package.sh --no-verify   package only (seconds): versions, metadata, file lists
#   scripts/check-package.sh --list     the files each package would carry
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
# --allow-dirty: checks what is in the work tree, committed or not (CI's clone is clean either way).
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
cargo package --workspace "${excluded[@]}" --allow-dirty --locked ${mode:+"$mode"} >"$out" 2>&1 || status=$?
# A package leaves its tests and benchmarks out (they need the workspace): cargo names each one it ignores.
grep -v '^warning: ignoring \(test\|bench\|example\) `' "$out" || true
if [ "$status" != 0 ]; then
  echo "check-package: FAIL (cargo package exited with $status)" >&2
  exit 1
fi
echo "check-package: PASS (${#publishable[@]} crates${mode:+ $mode}: ${publishable[*]})"
