//! Rebalance callbacks have a deadline: a callback that never returns is dropped after `listener_timeout`, so it
//! can neither hold a shard that should move nor stop the member from rejoining.

mod common;

use common::*;
use std::future::Future;
use std::time::{Duration, Instant};
use stream_consumer::{RebalanceListener, ShardId};
use test_support::wait_until;

const DEADLINE: Duration = Duration::from_secs(15);
const LISTENER_TIMEOUT: Duration = Duration::from_millis(300);

/// A listener whose `on_revoked` or `on_lost` never returns.
struct Hangs {
    on_revoked: bool,
    on_lost: bool,
}

impl RebalanceListener for Hangs {
    fn on_revoked(&self, _shard: ShardId) -> impl Future<Output = ()> + Send {
        let hang = self.on_revoked;
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
        }
    }

    fn on_lost(&self, _shards: Vec<ShardId>) -> impl Future<Output = ()> + Send {
        let hang = self.on_lost;
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
        }
    }
}

#[tokio::test]
async fn on_revoked_that_never_returns_is_dropped_after_the_listener_timeout_and_the_shard_moves() {
    let env = Env::start("hanging-revoked").await;
    let rec = Recorder::new();
    let a = env
        .consumer("a", &rec)
        .rebalance_listener(Hangs {
            on_revoked: true,
            on_lost: false,
        })
        .listener_timeout(LISTENER_TIMEOUT)
        .build()
        .unwrap()
        .spawn();
    wait_until(DEADLINE, "a to read every shard", || {
        let n = a.status().reading.len();
        async move { n == SHARDS as usize }
    })
    .await;
    let b_started = Instant::now();
    let b = env.consumer("b", &rec).build().unwrap().spawn();
    wait_until(DEADLINE, "b to read its share", || {
        let n = b.status().reading.len();
        async move { n == SHARDS as usize / 2 }
    })
    .await;
    let took = b_started.elapsed();
    let st = a.status();
    // Without the timeout, the drain never finishes: the coordinator fences a at the rebalance timeout (3 s) and b
    // waits for a's lease on top.
    assert_eq!((st.heartbeats.fenced, st.heartbeats.rejoins), (0, 0), "{st:?}");
    assert!(took < REBALANCE_TIMEOUT, "the handover took {took:?}");
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test]
async fn on_lost_that_never_returns_is_dropped_after_the_listener_timeout_and_the_member_reads_again() {
    let mut env = Env::start("hanging-lost").await;
    let rec = Recorder::new();
    let a = env
        .consumer("a", &rec)
        .rebalance_listener(Hangs {
            on_revoked: false,
            on_lost: true,
        })
        .listener_timeout(LISTENER_TIMEOUT)
        .build()
        .unwrap()
        .spawn();
    wait_until(DEADLINE, "a to read every shard", || {
        let n = a.status().reading.len();
        async move { n == SHARDS as usize }
    })
    .await;
    // No coordinator for longer than the lease: the lease runs out and `on_lost` is called (and hangs).
    env.abort_coordinator();
    wait_until(DEADLINE, "a's lease to run out", || {
        let st = a.status();
        async move { st.heartbeats.lease_expiries > 0 && st.reading.is_empty() }
    })
    .await;
    env.restart_coordinator().await;
    // Without the timeout, the heartbeat loop waits on `on_lost` forever and a never reads again.
    wait_until(DEADLINE, "a to read again", || {
        let n = a.status().reading.len();
        async move { n == SHARDS as usize }
    })
    .await;
    a.close().await.unwrap();
}
