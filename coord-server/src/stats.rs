//! Counters of what the coordinator did, readable by tests and exported as metrics.
//!
//! The atomics are the source of truth for what they count; [`crate::metrics`] copies them into this
//! coordinator's own Prometheus recorder (held here, see [`Stats::metrics`]) when `/metrics` is rendered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::metrics::{Metrics, Totals};
use crate::state_machine::{Event, Outcome};
use protocol::Status;

/// Monotonic counters (and one gauge-like maximum). All relaxed: they are observations, not synchronisation.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Heartbeats answered OK.
    pub heartbeats_ok: AtomicU64,
    /// Heartbeats answered SYNC_METADATA.
    pub heartbeats_sync: AtomicU64,
    /// Heartbeats answered REVOKE_PENDING.
    pub heartbeats_revoke_pending: AtomicU64,
    /// Heartbeats refused (fenced, unknown, invalid).
    pub heartbeats_rejected: AtomicU64,
    /// Clients reported a metadata version above the stored one.
    pub client_version_ahead: AtomicU64,
    /// Correction rounds opened.
    pub corrections_opened: AtomicU64,
    /// The stored metadata version went below one this process had seen.
    pub metadata_regressions: AtomicU64,
    /// Producers reported a routing version above the stored one.
    pub routing_regressions: AtomicU64,
    /// Consumers' routing reports checked against Redis in the background (finished, with or without an error).
    pub routing_report_checks: AtomicU64,
    /// Compare-and-set conflicts (another writer won; the section reloaded).
    pub revision_conflicts: AtomicU64,
    /// Critical sections that ran a batch of heartbeats.
    pub heartbeat_batches: AtomicU64,
    /// Heartbeats run in those sections (divided by the above: the mean batch size).
    pub heartbeats_batched: AtomicU64,
    /// Mutex acquisitions that found it held by another section and retried.
    pub mutex_busy: AtomicU64,
    /// Requests that could not get their group's mutex in time.
    pub mutex_timeouts: AtomicU64,
    /// Total mutex wait, in microseconds.
    pub mutex_wait_micros: AtomicU64,
    /// Requests answered METADATA_UNAVAILABLE.
    pub metadata_unavailable: AtomicU64,
    /// Of those, unreadable metadata (unknown schema/layout, corrupt JSON).
    pub metadata_corrupt: AtomicU64,
    /// Members expired.
    pub members_expired: AtomicU64,
    /// Members fenced.
    pub members_fenced: AtomicU64,
    /// Redis restarts noticed (run id change).
    pub redis_restarts: AtomicU64,
    /// Groups the tick loop visited because the due index said so.
    pub tick_visits_due: AtomicU64,
    /// Groups the tick loop visited for the safety sweep (see [`crate::due`]).
    pub tick_visits_sweep: AtomicU64,
    /// This coordinator's Prometheus recorder: labelled counters, gauges and histograms (see [`crate::metrics`]).
    metrics: Metrics,
}

impl Stats {
    pub(crate) fn heartbeat(&self, outcome: &Outcome) {
        let counter = match outcome {
            Outcome::Heartbeat(r) => match r.status {
                Status::SyncMetadata => &self.heartbeats_sync,
                Status::RevokePending => &self.heartbeats_revoke_pending,
                _ => &self.heartbeats_ok,
            },
            Outcome::Rejected(_) => &self.heartbeats_rejected,
            Outcome::Done => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn event(&self, e: &Event) {
        let counter = match e {
            Event::RegressionReported { .. } => &self.client_version_ahead,
            Event::CorrectionOpened { .. } => &self.corrections_opened,
            Event::MemberExpired(_) => &self.members_expired,
            Event::MemberFenced { .. } => &self.members_fenced,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn observe_batch(&self, size: usize) {
        self.heartbeat_batches.fetch_add(1, Ordering::Relaxed);
        self.heartbeats_batched.fetch_add(size as u64, Ordering::Relaxed);
    }

    pub(crate) fn observe_mutex_wait(&self, waited: Duration) {
        self.mutex_wait_micros
            .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
        self.metrics.mutex_wait(waited);
    }

    /// This coordinator's Prometheus recorder.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The counters the metrics copy, read now.
    pub fn totals(&self) -> Totals {
        let get = Stats::get;
        Totals {
            mutex_busy: get(&self.mutex_busy),
            heartbeat_batches: get(&self.heartbeat_batches),
            heartbeats_batched: get(&self.heartbeats_batched),
            mutex_timeouts: get(&self.mutex_timeouts),
            revision_conflicts: get(&self.revision_conflicts),
            metadata_regressions: get(&self.metadata_regressions),
            routing_regressions: get(&self.routing_regressions),
            metadata_unavailable: get(&self.metadata_unavailable),
            redis_restarts: get(&self.redis_restarts),
            tick_visits_due: get(&self.tick_visits_due),
            tick_visits_sweep: get(&self.tick_visits_sweep),
        }
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
