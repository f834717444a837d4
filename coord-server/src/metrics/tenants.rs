//! The per-tenant usage gauges and the Redis memory gauges: one usage scrape ([`Store::scrape_usage`],
//! [`Store::memory_info`]) at most every [`USAGE_MIN_REFRESH`], shared by `/metrics` and `/status`. The scrape's
//! own bound (`store::usage::MAX_USAGE_SHARDS` keys) and this period bound its cost: at most 8,192 cheap commands
//! every 10 s, whatever the scrape rate.

use metrics::{counter, gauge};
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

use super::{names, Metrics};
use crate::clock::LastRun;
use crate::error::StoreError;
use crate::store::Store;
use crate::tenants::{self, RedisMemory, UsageReport};

/// A usage scrape younger than this is served again.
pub const USAGE_MIN_REFRESH: Duration = Duration::from_secs(10);
/// A usage scrape that takes longer is abandoned; the previous report is served and the failure counted.
pub const USAGE_SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// When the usage was last scraped and what it found.
#[derive(Debug, Default)]
pub(super) struct UsageCache {
    scraped: LastRun,
    report: Option<Arc<UsageReport>>,
}

/// One usage scrape of `store` (the data Redis, and the metadata Redis when it is one of its own).
async fn scrape(store: &Store, prefixes: &[String]) -> Result<UsageReport, StoreError> {
    let samples = store.scrape_usage().await?;
    let mut redis = vec![RedisMemory::new("data", store.data().memory_info().await?)];
    if store.split() {
        redis.push(RedisMemory::new("metadata", store.memory_info().await?));
    }
    Ok(UsageReport {
        tenants: tenants::by_tenant(prefixes, &samples.streams),
        redis,
        truncated: samples.truncated,
    })
}

impl Metrics {
    /// The usage per tenant of `prefixes` (see [`crate::tenants`]), scraped again when the last scrape is older
    /// than [`USAGE_MIN_REFRESH`] (concurrent callers wait for one scrape), and recorded in the gauges. `None`
    /// until a scrape succeeded; after a failure the previous report.
    pub async fn tenant_usage(&self, store: &Store, prefixes: &[String]) -> Option<Arc<UsageReport>> {
        let mut cache = self.usage.lock().await;
        if !cache.scraped.due(USAGE_MIN_REFRESH) {
            return cache.report.clone();
        }
        // Marked before the scrape: a failing Redis is asked again after the period, not at every scrape.
        cache.scraped.mark();
        match tokio::time::timeout(USAGE_SCRAPE_TIMEOUT, scrape(store, prefixes)).await {
            Ok(Ok(report)) => {
                self.record_usage(&report);
                cache.report = Some(Arc::new(report));
            }
            Ok(Err(e)) => {
                warn!(error = %e, "usage scrape failed; serving the previous values");
                self.record(|| counter!(names::USAGE_SCRAPE_ERRORS).increment(1));
            }
            Err(_) => {
                warn!(
                    timeout_ms = USAGE_SCRAPE_TIMEOUT.as_millis() as u64,
                    "usage scrape timed out"
                );
                self.record(|| counter!(names::USAGE_SCRAPE_ERRORS).increment(1));
            }
        }
        cache.report.clone()
    }

    fn record_usage(&self, report: &UsageReport) {
        self.record(|| {
            for t in &report.tenants {
                let labels = [("tenant", t.tenant.clone())];
                gauge!(names::TENANT_STREAM_LENGTH, &labels).set(t.length as f64);
                gauge!(names::TENANT_MEMORY, &labels).set(t.memory_bytes as f64);
            }
            for r in &report.redis {
                gauge!(names::REDIS_USED_MEMORY, "redis" => r.redis).set(r.used_bytes as f64);
                gauge!(names::REDIS_MAXMEMORY, "redis" => r.redis).set(r.max_bytes as f64);
            }
        });
    }
}
