//! The HTTP API while more than one thing runs at once, against a real Redis: two coordinators sharing one Redis
//! and one group, a request that outlives its timeout while its section completes, readiness that follows Redis.

mod common;

use common::*;
use coord_server::server::CoordinatorHandle;
use coord_server::stats::Stats;
use protocol::messages::{HeartbeatRequest, HeartbeatResponse};
use protocol::{ShardId, Status};
use reqwest::header::RETRY_AFTER;
use reqwest::StatusCode;
use std::collections::BTreeSet;
use std::time::Duration;
use test_support::{wait_until, RedisServer};

const S: &str = "orders";
const G: &str = "billing";
const HB: &str = "/v1/streams/orders/groups/billing/heartbeat";
const WAIT: Duration = Duration::from_secs(10);

/// One simulated consumer: its last answer and the shards it reads.
struct Consumer {
    last: Option<HeartbeatResponse>,
    reading: Vec<ShardId>,
}

impl Consumer {
    fn next_request(&self, member: &str) -> HeartbeatRequest {
        match &self.last {
            None => join(member),
            Some(last) => follow_up(last, &self.reading),
        }
    }

    fn apply(&mut self, resp: HeartbeatResponse) {
        self.reading = reading_after(&resp, &self.reading);
        self.last = Some(resp);
    }

    fn settled(&self) -> bool {
        self.last
            .as_ref()
            .is_some_and(|r| r.status == Status::Ok && r.pending.is_empty() && r.revoke.is_empty())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_coordinators_on_one_redis_serialise_on_the_group() {
    let redis = RedisServer::start().await;
    let first = CoordinatorHandle::spawn(config(&redis.url()))
        .await
        .expect("first coordinator");
    let second = CoordinatorHandle::spawn(config(&redis.url()))
        .await
        .expect("second coordinator");
    let apis = [Api::new(first.url()), Api::new(second.url())];
    apis[0].create_group(S, G, 8).await;

    let members: Vec<String> = (0..6).map(|i| format!("m{i}")).collect();
    let mut consumers: Vec<Consumer> = members
        .iter()
        .map(|_| Consumer {
            last: None,
            reading: Vec::new(),
        })
        .collect();
    let mut rounds = 0;
    // Every round, every member heartbeats at once, alternating coordinators, until the group has settled.
    while !consumers.iter().all(Consumer::settled) {
        rounds += 1;
        assert!(rounds <= 40, "no convergence after 40 rounds");
        let requests = members.iter().enumerate().map(|(i, m)| {
            let api = apis[(i + rounds) % 2].clone();
            let req = consumers[i].next_request(m);
            async move { api.heartbeat(S, G, &req).await }
        });
        let answers = futures::future::join_all(requests).await;
        for (consumer, answer) in consumers.iter_mut().zip(answers) {
            match answer {
                Ok(resp) => consumer.apply(resp),
                Err((status, body)) => panic!("round {rounds}: a heartbeat failed: {status} {body:?}"),
            }
        }
    }

    // Steady state through both coordinators at once: every answer is OK and repeats the settled assignment.
    for round in 0..5 {
        let requests = members.iter().enumerate().map(|(i, m)| {
            let api = apis[(i + round) % 2].clone();
            let req = consumers[i].next_request(m);
            async move { api.heartbeat(S, G, &req).await }
        });
        let answers = futures::future::join_all(requests).await;
        for (consumer, answer) in consumers.iter_mut().zip(answers) {
            let resp = answer.unwrap_or_else(|(status, body)| panic!("steady round {round}: {status} {body:?}"));
            assert_eq!(resp.status, Status::Ok);
            assert_eq!(resp.assigned, consumer.reading, "a settled assignment does not move");
            consumer.apply(resp);
        }
    }

    let mut seen = BTreeSet::new();
    for c in &consumers {
        for s in &c.reading {
            assert!(seen.insert(*s), "shard {s} read by two members");
        }
    }
    assert_eq!(seen.len(), 8, "every shard is read");
    let one = apis[0].describe(S, G).await;
    let other = apis[1].describe(S, G).await;
    assert_eq!(one.revision, other.revision);
    assert_eq!(one.members.len(), members.len(), "{one:?}");
    assert_eq!(one.members, other.members);
    assert_eq!(one.shards, other.shards);
    for shard in &one.shards {
        assert_eq!(shard.owner, shard.target, "{one:?}");
    }
    for handle in [&first, &second] {
        let stats = handle.coordinator().stats();
        // Both instances ran sections (each waited on the shared Redis mutex some time) and none gave up on it.
        assert!(Stats::get(&stats.mutex_wait_micros) > 0);
        assert_eq!(Stats::get(&stats.mutex_timeouts), 0);
        assert_eq!(Stats::get(&stats.heartbeats_rejected), 0);
    }
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_timeout_is_a_typed_503_and_the_section_still_completes() {
    let redis = RedisServer::start().await;
    let mut config = config(&redis.url());
    config.tick_interval = Duration::from_secs(3600);
    config.request_timeout = Duration::from_millis(300);
    config.mutex_ttl = Duration::from_secs(10);
    config.critical_section_timeout = Duration::from_secs(8);
    config.default_timings = patient_timings();
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    let api = Api::new(coord.url());
    api.create_group_with(S, G, 2, patient_timings()).await;

    let mut con = redis.connection().await;
    let taken: Option<String> = redis::Script::new(
        "local h = redis.call('GET', KEYS[1]) if h and h ~= '' then return nil end \
         return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])",
    )
    .key(mutex_key(S, G))
    .arg("test")
    .arg(10_000)
    .invoke_async(&mut con)
    .await
    .unwrap();
    assert_eq!(taken.as_deref(), Some("OK"));
    let resp = api.post(HB, &join("a")).await;
    assert!(resp.headers().contains_key(RETRY_AFTER));
    let body = error_json(resp, StatusCode::SERVICE_UNAVAILABLE, Status::StoreUnavailable).await;
    assert!(body.message.contains("300 ms"), "{body:?}");
    assert_eq!(
        coord.coordinator().gate().in_flight(),
        1,
        "the section outlives the answer"
    );

    let _: () = redis::cmd("DEL")
        .arg(mutex_key(S, G))
        .query_async(&mut con)
        .await
        .unwrap();
    wait_until(WAIT, "the detached section to record the join", || async {
        api.describe(S, G)
            .await
            .members
            .iter()
            .any(|m| m.member_id.as_str() == "a")
    })
    .await;
    // The client's retry of the join is answered from what was recorded.
    let retried = api.hb(S, G, &join("a")).await;
    assert_eq!(retried.assigned, shards(&[0, 1]));
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_redis_while_healthz_stays_up() {
    let (mut redis, coord) = start().await;
    let api = Api::new(coord.url());
    assert_eq!(api.get("/readyz").await.status(), StatusCode::OK);

    redis.kill();
    wait_until(WAIT, "readyz to report Redis down", || async {
        api.get("/readyz").await.status() == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    error_json(
        api.get("/readyz").await,
        StatusCode::SERVICE_UNAVAILABLE,
        Status::StoreUnavailable,
    )
    .await;
    assert_eq!(api.get("/healthz").await.status(), StatusCode::OK);

    redis.restart().await;
    wait_until(WAIT, "readyz to recover with Redis", || async {
        api.get("/readyz").await.status() == StatusCode::OK
    })
    .await;
    coord.shutdown().await;
}
