//! Coordinator steady-state benchmark: 1,000 simulated members (lightweight HTTP clients) of one group of 1,024
//! shards against one in-process coordinator and a private redis-server.
//!
//! Prints: heartbeat latency p50/p99 at the rate 1,000 members produce at the default interval; the maximum
//! heartbeats/s one coordinator sustains; Redis commands and aggregate writes per no-change heartbeat (from
//! `INFO commandstats` and the hash revision); the aggregate size; and, as the same-run baseline, the raw Redis
//! round trip so the heartbeat cost reads as a ratio (a heartbeat is two script round trips).
//!
//! Run: `cargo bench -p coord-server --bench heartbeat` (about 30 s).
//! Goals (issue 7): p99 <= 5 ms at the default rate; >= 5,000 heartbeats/s.

use coord_server::server::CoordinatorHandle;
use coord_server::Config;
use protocol::messages::{CreateGroupRequest, HeartbeatRequest, HeartbeatResponse, RevokeState, RevokingShard};
use protocol::metadata::GroupTimings;
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{MemberEpoch, Status};
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_support::RedisServer;
use tokio::sync::Mutex;

const MEMBERS: usize = 1_000;
const SHARDS: u32 = 1_024;

struct Member {
    req: HeartbeatRequest,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn send(http: &reqwest::Client, url: &str, req: &HeartbeatRequest) -> HeartbeatResponse {
    let resp = http.post(url).json(req).send().await.expect("coordinator reachable");
    let status = resp.status();
    let body = resp.bytes().await.expect("body");
    assert!(
        status.is_success(),
        "heartbeat failed: {status} {}",
        String::from_utf8_lossy(&body)
    );
    serde_json::from_slice(&body).expect("heartbeat response")
}

/// Applies an answer the way the SDK would (read assigned, ack revokes at once).
fn apply(m: &mut Member, r: &HeartbeatResponse) {
    m.req.incarnation = r.incarnation;
    m.req.member_epoch = r.member_epoch;
    m.req.metadata_version = r.metadata_version;
    m.req.max_observed_version = m.req.max_observed_version.max(r.metadata_version);
    m.req.revoking = r
        .revoke
        .iter()
        .map(|&shard| RevokingShard {
            shard,
            state: RevokeState::Revoked,
        })
        .collect();
    m.req.owned = if r.status == Status::Ok {
        r.assigned.clone()
    } else {
        Vec::new()
    };
}

async fn commandstats_total(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info"))
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let redis = RedisServer::start().await;
    let mut config = Config::new(redis.url());
    config.listen = "127.0.0.1:0".parse().expect("literal");
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    let (stream, group) = (
        StreamName::new("bench").expect("name"),
        GroupName::new("g").expect("name"),
    );
    let timings = GroupTimings::default();
    coord
        .coordinator()
        .create_group(
            &stream,
            &group,
            &CreateGroupRequest {
                shard_count: Some(SHARDS),
                timings: Some(timings),
            },
        )
        .await
        .expect("group created");
    let url = format!(
        "{}{}",
        coord.url(),
        protocol::routes::heartbeat(stream.as_str(), group.as_str())
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .expect("client");
    let mut conn = redis.connection().await;

    // Baseline: the raw Redis round trip, same process, same moment.
    let mut rtts = Vec::with_capacity(2_000);
    for _ in 0..2_000 {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.expect("PING");
        rtts.push(t.elapsed());
    }
    rtts.sort();
    let rtt_p50 = percentile(&rtts, 0.5);

    // Join 1,000 members and converge (revokes acked at once).
    let mut members: Vec<Member> = (0..MEMBERS)
        .map(|i| Member {
            req: HeartbeatRequest {
                member_id: MemberId::new(format!("m{i:04}")).expect("name"),
                instance_id: format!("i{i}"),
                incarnation: protocol::Incarnation::NONE,
                member_epoch: MemberEpoch::JOIN,
                metadata_version: Default::default(),
                max_observed_version: Default::default(),
                owned: vec![],
                revoking: vec![],
                max_routing_version: protocol::RoutingVersion(0),
                max_shard_count: 0,
            },
        })
        .collect();
    let t = Instant::now();
    for m in &mut members {
        let r = send(&http, &url, &m.req).await;
        apply(m, &r);
    }
    let join_all = t.elapsed();
    for _round in 0..5 {
        for m in &mut members {
            let r = send(&http, &url, &m.req).await;
            apply(m, &r);
        }
    }
    let owned: usize = members.iter().map(|m| m.req.owned.len()).sum();
    assert_eq!(
        owned, SHARDS as usize,
        "every shard read by exactly one member after converging"
    );

    let revision = |conn: &mut redis::aio::MultiplexedConnection| {
        let key = protocol::keys::group_metadata(&stream, &group);
        let mut conn = conn.clone();
        async move {
            let (rev, size): (u64, u64) = redis::pipe()
                .hget(&key, "revision")
                .cmd("HSTRLEN")
                .arg(&key)
                .arg("aggregate")
                .query_async(&mut conn)
                .await
                .expect("revision");
            (rev, size)
        }
    };

    // Phase A: the default rate (every member every heartbeat interval), latency.
    let members: Vec<Arc<Mutex<Member>>> = members.into_iter().map(|m| Arc::new(Mutex::new(m))).collect();
    let interval = Duration::from_millis(timings.heartbeat_interval_ms);
    let phase = Duration::from_secs(10);
    let (rev_before, aggregate_bytes) = revision(&mut conn).await;
    let cmds_before = commandstats_total(&mut conn).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let (m, http, url) = (m.clone(), http.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            // Spread the members over the interval, as real clients drift apart.
            tokio::time::sleep(interval * i as u32 / MEMBERS as u32).await;
            let mut lat = Vec::new();
            let mut tick = tokio::time::interval(interval);
            while started.elapsed() < phase {
                tick.tick().await;
                let mut m = m.lock().await;
                let t = Instant::now();
                let r = send(&http, &url, &m.req).await;
                lat.push(t.elapsed());
                apply(&mut m, &r);
            }
            lat
        }));
    }
    let mut lat: Vec<Duration> = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("member task"));
    }
    let cmds_after = commandstats_total(&mut conn).await;
    let (rev_after, _) = revision(&mut conn).await;
    lat.sort();
    let beats = lat.len() as u64;

    // Phase B: as fast as 64 concurrent callers can go.
    let phase_b = Duration::from_secs(5);
    let started_b = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..64 {
        let (members, http, url) = (members.clone(), http.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            let mut i = w;
            while started_b.elapsed() < phase_b {
                let mut m = members[i % MEMBERS].lock().await;
                let r = send(&http, &url, &m.req).await;
                apply(&mut m, &r);
                n += 1;
                i += 64;
            }
            n
        }));
    }
    let mut total = 0u64;
    for t in tasks {
        total += t.await.expect("worker");
    }
    let max_rate = total as f64 / started_b.elapsed().as_secs_f64();

    let p50 = percentile(&lat, 0.5);
    let p99 = percentile(&lat, 0.99);
    println!("## Coordinator steady state ({MEMBERS} members, {SHARDS} shards, default timings)");
    println!("| figure | value | goal |");
    println!("|---|---:|---:|");
    println!("| join of {MEMBERS} members (sequential) | {:.0} ms | |", ms(join_all));
    println!(
        "| offered rate (phase A) | {:.0} hb/s | |",
        beats as f64 / phase.as_secs_f64()
    );
    println!("| heartbeat latency p50 | {:.2} ms | |", ms(p50));
    println!("| heartbeat latency p99 | {:.2} ms | <= 5 ms |", ms(p99));
    println!("| max heartbeats/s (64 concurrent callers) | {max_rate:.0} | >= 5000 |");
    println!(
        "| Redis commands per no-change heartbeat | {:.2} | |",
        (cmds_after - cmds_before) as f64 / beats as f64
    );
    println!("| aggregate writes during phase A | {} | 0 |", rev_after - rev_before);
    println!("| aggregate size | {aggregate_bytes} bytes | |");
    println!("| raw Redis round trip p50 (baseline) | {:.3} ms | |", ms(rtt_p50));
    println!(
        "| heartbeat p50 / (2 x raw round trip) | {:.1} | |",
        p50.as_secs_f64() / (2.0 * rtt_p50.as_secs_f64())
    );
    coord.shutdown().await;
}
