#!/usr/bin/env bash
# Every benchmark of issue 7, in sequence, release builds, each against private redis-server processes it starts
# itself on free loopback ports. Prints the machine, then each benchmark's table (see BENCHMARKS.md).
#
#   scripts/bench.sh            # full run: a few minutes once built
#   scripts/bench.sh --quick    # smaller record counts, fewer rounds and trials (about a minute)
#   scripts/bench.sh --only consumer,latency   # a subset: heartbeat, assignor, producer, consumer, latency, cluster
#
# The machine is what limits the figures: run it when nothing else is busy (the load average is printed before
# and after). Ratios (SDK / raw) are measured within one run and are the stable figures; absolute rates are not.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
only="heartbeat,assignor,producer,consumer,latency,cluster"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --only) shift; only="$1" ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
wants() { case ",$only," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server is not on PATH. Install it (Debian/Ubuntu: apt-get install -y redis-server) or set" >&2
  echo "REDIS_SERVER_BIN to its path." >&2
  exit 1
fi

if [ "$quick" = 1 ]; then
  producer_args=(--records 100000 --rounds 1 --calibration-rounds 1)
  cluster_rounds=1
  consumer_args=(--records 100000 --rounds 1)
  latency_args=(--trials 2 --e2e-secs 4)
else
  producer_args=(--records 300000 --rounds 3)
  consumer_args=(--records 400000 --rounds 5)
  latency_args=(--trials 5 --e2e-secs 10)
fi

echo "== building (release)"
# Where cargo puts the binaries (CARGO_TARGET_DIR when set, as cargo itself honours it).
bin_dir="${CARGO_TARGET_DIR:-target}/release"
cargo build --release -p benches --bin consumer_bench --bin latency_bench --bin producer_bench
if wants heartbeat || wants assignor; then
  cargo bench -p coord-server --no-run
fi

echo
echo "# Machine"
echo "- cores: $(nproc); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "- $(redis-server --version | cut -d' ' -f1-3)"
echo "- $(rustc --version)"
echo "- load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
started=$(date +%s)

if wants heartbeat; then
  echo
  cargo bench -q -p coord-server --bench heartbeat 2>/dev/null
fi
if wants assignor; then
  echo
  echo "## Assignor"
  cargo bench -q -p coord-server --bench assignor 2>/dev/null
fi
if wants producer; then
  echo
  echo "## Producer throughput (SDK vs raw pipelined XADD, same run)"
  "$bin_dir"/producer_bench "${producer_args[@]}"
fi
if wants consumer; then
  echo
  "$bin_dir"/consumer_bench "${consumer_args[@]}"
fi
if wants latency; then
  echo
  "$bin_dir"/latency_bench "${latency_args[@]}"
fi
if wants cluster; then
  # A private local 3-master Redis Cluster (redis-server 7.0+); on 2 cores this shows the cost of the cluster
  # paths against raw cluster clients, not node scaling.
  echo
  echo "## Producer throughput on a local 3-master cluster (SDK vs raw redis-rs cluster pipelines, same run)"
  "$bin_dir"/producer_bench --cluster --records 200000 --rounds "${cluster_rounds:-3}"
  echo
  "$bin_dir"/consumer_bench --cluster "${consumer_args[@]}"
fi

echo
echo "- load average after: $(cut -d' ' -f1-3 /proc/loadavg); benchmarks took $(( $(date +%s) - started )) s"
