//! The usage of each tenant (see [`crate::tenants`]), for `/metrics` and `/status`.

use std::sync::Arc;

use super::Coordinator;
use crate::tenants::{self, UsageReport};

impl Coordinator {
    /// What each tenant's streams use on the data Redis, and each Redis's memory: the usage scrape, at most once
    /// per [`crate::metrics::tenants::USAGE_MIN_REFRESH`]. `None` until one succeeded.
    pub async fn tenant_usage(&self) -> Option<Arc<UsageReport>> {
        let prefixes = tenants::prefixes(&self.inner.config.tokens);
        self.inner
            .stats
            .metrics()
            .tenant_usage(&self.inner.store, &prefixes)
            .await
    }
}
