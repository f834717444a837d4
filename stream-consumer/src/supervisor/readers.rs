//! The bookkeeping of the running shard readers: start one (its exit reported to the loop), account for its
//! exit, kill some within one grace period while the lease of the others is still watched, and find a reader
//! that has failed to reach Redis for too long.

use futures::FutureExt;
use protocol::ShardId;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::{sleep_until_opt, ReaderExitEvent, ReaderHandle, State};
use crate::in_flight::InFlight;
use crate::lease::now;
use crate::shard_reader::{self, ReadHealth, ReaderControl, ReaderExit};

/// How long a killed reader may take to stop before its task is aborted.
const KILL_GRACE: Duration = Duration::from_secs(3);

impl State {
    /// The shard whose reader has failed to reach Redis the longest, if that is longer than
    /// `read_failure_timeout`.
    pub(super) fn unreadable(&self) -> Option<(ShardId, Duration)> {
        let now = now();
        self.readers
            .iter()
            .filter_map(|(&shard, h)| h.health.failing_for(now).map(|d| (shard, d)))
            .max_by_key(|&(_, d)| d)
            .filter(|&(_, d)| d >= self.d.config.timings.read_failure_timeout)
    }

    pub(super) fn start_reader(&mut self, shard: ShardId) {
        let generation = self.next_generation;
        self.next_generation += 1;
        let ctl = ReaderControl {
            stop: CancellationToken::new(),
            kill: self.d.kill.child_token(),
        };
        let in_flight = Arc::new(InFlight::default());
        let health = Arc::new(ReadHealth::default());
        let token = self.d.membership.token(shard);
        let run = shard_reader::run(
            Arc::clone(&self.d.shared),
            shard,
            token,
            ctl.clone(),
            Arc::clone(&in_flight),
            Arc::clone(&health),
        );
        let tx = self.exits_tx.clone();
        let task = self.tracker.spawn(async move {
            // A bug in the reader must not leave the shard marked as read by nobody: report it stopped.
            let exit = AssertUnwindSafe(run).catch_unwind().await.unwrap_or_else(|_| {
                error!(shard = %shard, "shard reader panicked");
                ReaderExit::Killed
            });
            let _ = tx.send(ReaderExitEvent {
                shard,
                generation,
                exit,
            });
            exit
        });
        if let Some(old) = self.readers.insert(
            shard,
            ReaderHandle {
                generation,
                ctl,
                task,
                in_flight,
                health,
            },
        ) {
            // Cannot happen (a shard restarts only once its reader exited); never leave two readers.
            old.ctl.kill.cancel();
        }
    }

    /// A reader exited on its own (drained). Returns whether the shard became revoked (worth a prompt heartbeat).
    pub(super) fn on_exit(&mut self, ev: ReaderExitEvent) -> bool {
        match self.readers.get(&ev.shard) {
            Some(h) if h.generation == ev.generation => {
                debug_assert_eq!(h.in_flight.current(), 0, "a stopped reader has nothing in flight");
                self.readers.remove(&ev.shard);
            }
            // A killed reader, already accounted for.
            _ => return false,
        }
        if ev.exit == ReaderExit::Killed && self.closing {
            self.killed_on_close.insert(ev.shard);
        }
        let revoked = self.d.membership.reader_stopped(ev.shard);
        if revoked {
            debug!(shard = %ev.shard, "shard drained; reporting it revoked");
        }
        self.publish();
        revoked
    }

    /// Kills the readers of `shards` and waits until they stopped (aborting stragglers).
    pub(super) async fn kill_readers(&mut self, shards: &[ShardId]) {
        for shard in shards {
            if let Some(h) = self.readers.get(shard) {
                h.ctl.kill.cancel();
            }
        }
        // One grace period for all of them; while waiting, the lease of the readers that keep running is watched.
        let deadline = tokio::time::Instant::now() + KILL_GRACE;
        let mut others_killed = false;
        for shard in shards {
            let Some(mut h) = self.readers.remove(shard) else {
                continue;
            };
            loop {
                let lease_end = if others_killed { None } else { self.lease_watch() };
                tokio::select! {
                    biased;
                    r = tokio::time::timeout_at(deadline, &mut h.task) => {
                        if r.is_err() {
                            warn!(shard = %shard, "shard reader did not stop in time; aborting its task");
                            h.task.abort();
                        }
                        break;
                    }
                    _ = sleep_until_opt(lease_end) => {
                        // The lease ran out meanwhile: stop the others now; the main loop reports it (expiry).
                        for other in self.readers.values() {
                            other.ctl.kill.cancel();
                        }
                        others_killed = true;
                    }
                }
            }
            self.d.membership.reader_stopped(*shard);
        }
    }
}
