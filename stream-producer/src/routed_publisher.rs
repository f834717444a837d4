//! [`RoutedPublisher`]: the publisher with the routing it publishes with. What the producer handle and its
//! batcher share (the refresher, the publisher and the counters), and the one publish path both take: a routing
//! valid now, then the publish, then the records a fence refused routed again (see the ordering contract in the
//! `producer` module).

use std::sync::Arc;
use std::time::Duration;

use protocol::RoutingVersion;

use crate::error::PublishError;
use crate::published::Published;
use crate::publisher::Publisher;
use crate::record::Record;
use crate::refresher::Refresher;
use crate::routing_cache::RoutingInfo;
use crate::stats::Stats;

/// State shared by the handle and its tasks.
#[derive(Debug)]
pub(crate) struct RoutedPublisher {
    pub(crate) refresher: Arc<Refresher>,
    pub(crate) publisher: Publisher,
    pub(crate) stats: Arc<Stats>,
    /// Re-route and retry records refused by a fence ([`ProducerConfig::reroute_fenced`](crate::config::ProducerConfig::reroute_fenced)),
    /// waiting this long for the routing the fence names; `None`: off.
    pub(crate) reroute: Option<RerouteWait>,
}

/// How long a re-route waits for the coordinator to serve the version a fence names. A growth seals its parents
/// before it commits the routing that lists its children ([`docs/resharding.md`]), so a producer the seal refused can
/// refresh in between and still get the old routing: it asks again, backing off, for as long as one coordinator
/// request may take.
///
/// [`docs/resharding.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/resharding.md
#[derive(Debug, Clone, Copy)]
pub(crate) struct RerouteWait {
    /// The first pause between two refreshes that did not bring the version; doubles up to `longest`.
    pub(crate) first: Duration,
    /// The longest pause.
    pub(crate) longest: Duration,
    /// How long to wait in all before the records are reported fenced.
    pub(crate) within: Duration,
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
                // Counted once the re-routes settled them: a refused record sent again is not also not written.
                self.publisher.count(&results);
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
            let Some(wait) = self.reroute.filter(|_| round < MAX_REROUTES) else {
                return;
            };
            let Some(routing) = self.routing_serving(fence, wait).await else {
                // The coordinator did not come to serve the fenced version: sending again would be refused again.
                return;
            };
            let again: Vec<&Record> = fenced.iter().map(|&i| records[i].borrow()).collect();
            let retried = self.publisher.publish(&again, routing).await;
            for (i, r) in fenced.into_iter().zip(retried) {
                results[i] = r;
            }
        }
    }

    /// The routing once the coordinator serves `fence` or a later version, or `None` when it did not within
    /// `wait` (or the routing is unavailable).
    async fn routing_serving(&self, fence: RoutingVersion, wait: RerouteWait) -> Option<RoutingInfo> {
        let deadline = tokio::time::Instant::now() + wait.within;
        let mut pause = wait.first;
        loop {
            let routing = self.refresher.routing_for_publish().await.ok()?;
            if routing.version >= fence {
                return Some(routing);
            }
            if tokio::time::Instant::now() + pause > deadline {
                return None;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(wait.longest);
            // The answer that did not bring the version settled the hint: ask again.
            self.refresher.hint_newer_version(fence);
        }
    }
}
