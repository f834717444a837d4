//! What the producer handle and its batcher share: the refresher, the publisher and the counters, and the one
//! publish path both take (see the ordering contract in [`crate::producer`]).

use std::sync::Arc;

use crate::error::PublishError;
use crate::publisher::{Published, Publisher, Record};
use crate::refresher::Refresher;
use crate::stats::Stats;

/// State shared by the handle and its tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) refresher: Arc<Refresher>,
    pub(crate) publisher: Publisher,
    pub(crate) stats: Arc<Stats>,
}

impl Shared {
    /// Publishes records that passed [`Record::check`], following the ordering contract of this module.
    pub(crate) async fn publish_checked<R: std::borrow::Borrow<Record>>(
        &self,
        records: &[R],
    ) -> Vec<Result<Published, PublishError>> {
        match self.refresher.routing_for_publish().await {
            Ok(routing) => self.publisher.publish(records, routing).await,
            Err(e) => {
                let n = records.len() as u64;
                self.stats
                    .records_not_written
                    .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                self.stats.metrics.records(0, n, 0);
                vec![Err(e); records.len()]
            }
        }
    }
}
