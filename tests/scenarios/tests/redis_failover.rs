//! A real Redis failover with data loss: a primary and a replica; the replica has metadata version N-1 when it is
//! promoted (the replication cut), the old primary then records N (a rebalance the clients see), and dies.
//! Coordinators and clients move to the promoted replica; the correction round brings everyone back to N-1 and
//! then past N, with no shard read by two members, fencing tokens above every token of the lost history, and the
//! regression shows in the coordinator's metrics.

mod common;

use common::*;
use protocol::Status;
use scenario_tests::History;
use std::net::SocketAddr;
use stream_consumer::ConsumerHandle;
use test_support::{FaultProxy, Mode, ReplicaPair};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_to_a_replica_that_lost_version_n_brings_everyone_back_to_n_minus_1_then_past_n() {
    let ReplicaPair { primary, replica } = ReplicaPair::start().await;
    let primary_addr = SocketAddr::from(([127, 0, 0, 1], primary.port()));
    let replica_addr = SocketAddr::from(([127, 0, 0, 1], replica.port()));
    // Clients reach Redis through a stable address that the failover re-points, as a Sentinel-aware client or
    // a DNS name would; coordinators are configured with the Redis URL itself.
    let redis_front = FaultProxy::start(primary_addr).await;
    let mut s = Scenario::on(primary, "failover", 4).await;
    let next = s.reserve_coordinator();
    let history = History::new();
    let spawn = |s: &Scenario, m: &str| -> ConsumerHandle {
        let b = consumer_builder(&s.stream, &s.group, m, s.urls(), redis_front.url());
        Scenario::spawn_with(b, m, &history, &Gate::open())
    };
    let producer = s.producer().redis(redis_front.url()).build().unwrap();
    let a = spawn(&s, "a");
    let b = spawn(&s, "b");
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "two shards each", |st| {
            st.reading.len() == 2 && st.revoking.is_empty()
        })
        .await;
    }
    publish(&producer, &history, 0, 20, 5).await;
    wait_all_handled(&history, DEADLINE).await;

    // The replica has N-1, then the cut.
    test_support::wait_replicated(&s.redis).await;
    let n_minus_1 = s.describe().await.metadata_version;
    replica.promote().await;

    // N, on the old primary only: c joins and takes a shard; everyone sees the new version.
    let c = spawn(&s, "c");
    wait_status(&c, DEADLINE, "c reads a shard", |st| {
        !st.reading.is_empty() && st.revoking.is_empty()
    })
    .await;
    for h in [&a, &b] {
        wait_status(h, DEADLINE, "the rebalance to settle", |st| st.revoking.is_empty()).await;
    }
    let n = [&a, &b, &c].iter().map(|h| h.status().metadata_version).max().unwrap();
    assert!(n > n_minus_1, "clients saw version {n}, the replica has {n_minus_1}");
    // The fencing tokens of the history about to be lost.
    let lost_tokens: Vec<_> = s.describe().await.shards.iter().map(|sh| sh.fencing_token).collect();

    // The primary dies. The coordinator that served it dies too; a new one starts on the promoted replica, at a
    // URL the clients already know; the clients' Redis address now leads to the replica.
    s.redis.kill();
    s.coords[0].abort();
    redis_front.set_target(replica_addr);
    redis_front.set_mode(Mode::Reset);
    redis_front.set_mode(Mode::Pass);
    s.coords[next].restart_on(&replica.url()).await;

    // a and b are told to go back to N-1; c's join is lost, it rejoins; the round closes past N.
    for h in [&a, &b, &c] {
        wait_status(h, DEADLINE, "OK again after the round, above N", |st| {
            st.last_status == Some(Status::Ok) && st.metadata_version > n && st.revoking.is_empty()
        })
        .await;
    }
    for h in [&a, &b] {
        let st = h.status();
        assert!(st.heartbeats.sync_metadata >= 1, "{st:?}");
    }
    assert!(c.status().heartbeats.unknown_member >= 1, "c's join was lost with N");
    let g = s.describe().await;
    assert_no_split(&g);
    assert!(g.correction.is_none());
    for (shard, lost) in g.shards.iter().zip(&lost_tokens) {
        assert!(
            shard.fencing_token > *lost,
            "shard {}: token {} is not above {lost}, its token in the lost history",
            shard.shard,
            shard.fencing_token
        );
    }
    let metrics = s.coords[next].api().metrics().await;
    let regressions = metric(&metrics, "redis_stream_coord_metadata_regressions_total");
    let ahead = metric(&metrics, "redis_stream_coord_client_version_ahead_total");
    assert!(
        regressions >= 1.0 && ahead >= 1.0,
        "regressions {regressions}, clients ahead {ahead}"
    );

    // Reading goes on from the survivor.
    publish(&producer, &history, 100, 20, 5).await;
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    let total: usize = [&a, &b, &c].iter().map(|h| h.status().reading.len()).sum();
    assert_eq!(total, 4);
    producer.close().await.unwrap();
    for h in [a, b, c] {
        h.close().await.unwrap();
    }
}
