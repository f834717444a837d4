//! What the benchmark binaries (`producer_bench`, `consumer_bench`, `latency_bench`, `group_scale_bench`, in
//! src/bin) share: the global allocator, the process's own CPU time ([`cpu`]) and memory ([`mem`]), and waiting for
//! a group to settle ([`settle`]); the parts of `group_scale_bench` are in [`scale`].
//!
//! The benchmarks start their own private `redis-server` (or local Redis Cluster) through `test_support`, and an
//! in-process coordinator; `scripts/bench.sh` runs them all, BENCHMARKS.md keeps their figures.

/// The allocator of every benchmark (feature `jemalloc`, on by default), the one the examples' binaries use.
/// Records are allocated by the caller's task and freed by the producer's batcher or a connection's task, often on
/// another thread; glibc's allocator handles that pattern badly (BENCHMARKS.md, issue 17). A library cannot choose
/// for its embedding application, so the SDK crates leave the choice to it.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The name of the global allocator the benchmarks were built with (printed with their figures).
pub const ALLOCATOR: &str = if cfg!(feature = "jemalloc") {
    "jemalloc"
} else {
    "system (glibc)"
};

pub mod cpu;
pub mod group;
pub mod mem;
pub mod scale;
pub mod settle;
