//! One heartbeat: send it while watching the lease and the readers, then act on its answer (grant the lease,
//! apply the assignment, plan the next heartbeat) or on its failure (jittered backoff capped at the interval).

use backon::{BackoffBuilder, ExponentialBuilder};
use client_core::CoordError;
use protocol::messages::HeartbeatResponse;
use protocol::Status;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

use super::{prompt, sleep_until_opt, Flow, State};
use crate::error::ConsumerError;
use crate::lease::{effective_lease, now};
use crate::metrics::failure_status;

impl State {
    /// One heartbeat, watching the lease and reader exits while it is in flight.
    pub(super) async fn heartbeat(&mut self) -> Flow {
        let req = self.d.membership.request();
        let client = Arc::clone(&self.client);
        let (stream, group) = (self.d.config.stream.clone(), self.d.config.group.clone());
        let joining = req.member_epoch.is_join();
        // Captured before sending: the lease counts from here (see `crate::lease`).
        let sent_at = now();
        let call = async move { client.heartbeat(&stream, &group, &req).await };
        tokio::pin!(call);
        // A shard drained while this heartbeat was in flight is reported by the next one, sent at once.
        let mut drained_meanwhile = false;
        let result = loop {
            let lease_end = self.lease_watch();
            tokio::select! {
                biased;
                _ = self.d.kill.cancelled() => return Flow::Aborted,
                r = &mut call => break r,
                Some(ev) = self.exits_rx.recv() => drained_meanwhile |= self.on_exit(ev),
                _ = sleep_until_opt(lease_end) => self.expire_lease().await,
            }
        };
        let flow = self.after_heartbeat(result, sent_at, joining).await;
        match flow {
            Flow::Next(_) if drained_meanwhile => Flow::Next(prompt()),
            other => other,
        }
    }

    async fn after_heartbeat(
        &mut self,
        result: Result<HeartbeatResponse, CoordError>,
        sent_at: Instant,
        joining: bool,
    ) -> Flow {
        match result {
            Ok(resp) if resp.member_epoch.is_leave() => {
                // Not a member any more (only a leave answers -1): same as UNKNOWN_MEMBER.
                self.lost(Status::UnknownMember, "answer without a member epoch").await;
                Flow::Next(prompt())
            }
            Ok(resp) => self.on_answer(resp, sent_at).await,
            Err(e) if e.status().is_some_and(Status::is_replaced) => {
                self.replaced(&e).await;
                let member_id = self.d.config.member_id.to_string();
                Flow::Fatal(ConsumerError::Replaced { member_id, source: e })
            }
            Err(e) if e.requires_rejoin() => {
                let status = e.status().unwrap_or(Status::UnknownMember);
                self.lost(status, &e.to_string()).await;
                Flow::Next(prompt())
            }
            Err(e) => self.on_failure(e, joining),
        }
    }

    async fn on_answer(&mut self, resp: HeartbeatResponse, sent_at: Instant) -> Flow {
        self.count(resp.status);
        let t = &self.d.config.timings;
        self.backoff = None;
        let lease = effective_lease(
            Duration::from_millis(resp.assignment_lease_ms),
            t.assignment_lease,
            t.lease_safety_margin,
        );
        // The coordinator's interval, but never so long that the lease runs out between two heartbeats.
        self.interval = Duration::from_millis(resp.heartbeat_interval_ms)
            .min(lease / 2)
            .max(Duration::from_millis(1));
        self.lease.grant(sent_at, lease);
        self.d.shared.lease.publish(&self.lease);
        let was_joined = self.d.membership.is_joined();
        let now = now();
        let actions = self.d.membership.apply(&resp, self.lease.is_valid_at(now));
        if !was_joined {
            info!(group = %self.d.config.group, member_id = %resp.member_id, epoch = %resp.member_epoch,
                metadata_version = %resp.metadata_version, "joined the group");
        }
        if !actions.drain.is_empty() || !actions.start.is_empty() {
            self.d.shared.metrics.rebalanced();
            info!(group = %self.d.config.group, member_id = %resp.member_id, status = %resp.status,
                metadata_version = %resp.metadata_version, epoch = %resp.member_epoch,
                drain = ?actions.drain, start = ?actions.start, pending = ?resp.pending, "assignment changed");
        }
        // Stop what is no longer ours before starting anything new.
        for shard in &actions.drain {
            if let Some(h) = self.readers.get(shard) {
                h.ctl.stop.cancel();
            }
        }
        if let Some(v) = actions.max_observed_grew {
            // Written in the background and retried until it succeeds: the loop that watches the lease never waits.
            self.d.persister.observe(v.0);
        }
        self.d.routing_observed.raise(resp.routing_version.0);
        // The status before the new readers: a handler they start never sees a status older than the lease it
        // runs under (a scenario's recorder read the lease that had ended during an outage, 0.93 s before).
        self.publish();
        for &shard in &actions.start {
            self.start_reader(shard);
        }
        if actions.prompt {
            Flow::Next(prompt())
        } else {
            Flow::Next(sent_at + self.interval)
        }
    }

    fn on_failure(&mut self, e: CoordError, joining: bool) -> Flow {
        self.counters.failed += 1;
        self.d.shared.metrics.heartbeat(failure_status(&e));
        if let Some(status) = e.status() {
            self.d.membership.record_status(status);
        }
        // A join over the token's member quota stays refused until an operator acts: say so, do not loop.
        if joining && (e.is_quota_exceeded() || (!e.is_retryable() && self.counters.answers() == 0)) {
            error!(group = %self.d.config.group, error = %e, "the coordinator refused the consumer");
            return Flow::Fatal(ConsumerError::Coordinator(e));
        }
        let delay = self
            .backoff
            .get_or_insert_with(|| {
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(50))
                    .with_max_delay(self.interval)
                    .with_jitter()
                    .with_jitter_seed(rand::random())
                    .without_max_times()
                    .build()
            })
            .next()
            .unwrap_or(self.interval)
            .min(self.interval)
            // RATE_LIMITED: the coordinator refuses this token until then; asking earlier only spends the bucket.
            .max(e.retry_after().unwrap_or_default());
        let now = now();
        if joining {
            // Nothing is read before a join is answered: there is no lease to read on within.
            warn!(group = %self.d.config.group, member_id = %self.d.config.member_id, error = %e, retry_in = ?delay,
                "cannot join the group yet; retrying");
        } else {
            warn!(group = %self.d.config.group, member_id = %self.d.config.member_id, error = %e, retry_in = ?delay,
                lease_left = ?self.lease.remaining_at(now), "heartbeat failed; reading on within the lease");
        }
        self.publish();
        Flow::Next(now + delay)
    }
}
