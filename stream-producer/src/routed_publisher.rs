//! [`RoutedPublisher`]: the publisher with the routing it publishes with. What the producer handle and its
//! batcher share (the refresher, the publisher and the counters), and the one publish path both take: a routing
//! valid now, then the publish, then the records a fence refused routed again (see the ordering contract in the
//! `producer` module).

use std::sync::Arc;

use crate::error::PublishError;
use crate::published::Published;
use crate::publisher::Publisher;
use crate::record::Record;
use crate::refresher::Refresher;
use crate::stats::Stats;

/// State shared by the handle and its tasks.
#[derive(Debug)]
pub(crate) struct RoutedPublisher {
    pub(crate) refresher: Arc<Refresher>,
    pub(crate) publisher: Publisher,
    pub(crate) stats: Arc<Stats>,
    /// Re-route and retry records refused by a fence ([`ProducerConfig::reroute_fenced`](crate::config::ProducerConfig::reroute_fenced)).
    pub(crate) reroute_fenced: bool,
}

impl RoutedPublisher {
    /// Publishes records that passed [`Record::check`], following the ordering contract of this module.
    pub(crate) async fn publish_checked<R: std::borrow::Borrow<Record>>(
        &self,
        records: &[R],
    ) -> Vec<Result<Published, PublishError>> {
        match self.refresher.routing_for_publish().await {
            Ok(routing) => {
                let mut results = self.publisher.publish(records, routing).await;
                self.after_fence(records, &mut results).await;
                results
            }
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

/// Times the producer re-routes records refused by a fence before it reports them [`PublishError::Fenced`].
const MAX_REROUTES: usize = 3;

impl RoutedPublisher {
    /// A fence refused records: refresh the routing at once, and with `reroute_fenced` send them again with it.
    async fn after_fence<R: std::borrow::Borrow<Record>>(
        &self,
        records: &[R],
        results: &mut [Result<Published, PublishError>],
    ) {
        for round in 0..=MAX_REROUTES {
            let fenced: Vec<usize> = results
                .iter()
                .enumerate()
                .filter(|(_, r)| matches!(r, Err(PublishError::Fenced { .. })))
                .map(|(i, _)| i)
                .collect();
            let Some(fence) = fenced
                .iter()
                .filter_map(|&i| match &results[i] {
                    Err(PublishError::Fenced { fence, .. }) => Some(*fence),
                    _ => None,
                })
                .max()
            else {
                return;
            };
            // The next publish (or this re-route) waits for a refresh that sees the new routing.
            self.refresher.hint_newer_version(fence);
            if !self.reroute_fenced || round == MAX_REROUTES {
                return;
            }
            let Ok(routing) = self.refresher.routing_for_publish().await else {
                return;
            };
            if routing.version < fence {
                // The coordinator does not serve the fenced version yet: sending again would be refused again.
                return;
            }
            let again: Vec<&Record> = fenced.iter().map(|&i| records[i].borrow()).collect();
            let retried = self.publisher.publish(&again, routing).await;
            for (i, r) in fenced.into_iter().zip(retried) {
                results[i] = r;
            }
        }
    }
}
