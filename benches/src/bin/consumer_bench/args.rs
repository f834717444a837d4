//! The command line, and the raw loop's kinds of connection (`--raw-links`).

use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Raw XREADGROUP + pipelined XACK loop vs the consumer SDK, same records, same run")]
pub(crate) struct Args {
    /// Records pre-loaded into the 8 shards.
    #[arg(long, default_value_t = 400_000)]
    pub(crate) records: usize,
    /// Payload size of every record, in bytes.
    #[arg(long, default_value_t = 100)]
    pub(crate) payload_bytes: usize,
    /// Entries per read (`XREADGROUP COUNT`; the SDK's batch size), the same for both.
    #[arg(long, default_value_t = stream_consumer::DEFAULT_BATCH_SIZE)]
    pub(crate) count: usize,
    /// SDK member counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub(crate) members: Vec<usize>,
    /// Rounds of every mode, interleaved (the median of each is reported).
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: usize,
    /// Skip the raw loop (for profiling the SDK alone; no ratios then).
    #[arg(long)]
    pub(crate) no_raw: bool,
    /// Connections of the raw loop to try, comma-separated: `multiplexed` (redis-rs's multiplexed connection and
    /// reply parser) and `pipelined` (`redis_link::PipelinedConnection`, the SDK's own reader connection and
    /// parser). Every one runs in every round; the best median is the baseline of the ratios. One server only
    /// (a cluster's raw loop uses redis-rs cluster connections).
    #[arg(long, value_delimiter = ',', default_value = "multiplexed,pipelined")]
    pub(crate) raw_links: Vec<RawLink>,
    /// Skip the SDK runs (for profiling the raw loop alone).
    #[arg(long)]
    pub(crate) no_sdk: bool,
    /// Run on a private local 3-master Redis Cluster instead of one redis-server.
    #[arg(long)]
    pub(crate) cluster: bool,
}

/// The connection a raw shard task reads through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum RawLink {
    /// redis-rs's multiplexed connection (and its reply parser).
    Multiplexed,
    /// `redis_link::PipelinedConnection` (the parser the SDK's readers use).
    Pipelined,
}

impl RawLink {
    pub(crate) fn label(self) -> &'static str {
        match self {
            RawLink::Multiplexed => "redis-rs multiplexed",
            RawLink::Pipelined => "redis_link pipelined",
        }
    }
}

/// Shards of the benchmark stream.
pub(crate) const SHARDS: u32 = 8;
