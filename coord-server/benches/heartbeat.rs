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

/// The bench's coordinator, its group, and an HTTP client for heartbeats.
struct Bench {
    redis: RedisServer,
    coord: CoordinatorHandle,
    stream: StreamName,
    group: GroupName,
    timings: GroupTimings,
    url: String,
    http: reqwest::Client,
}

impl Bench {
    async fn start() -> Self {
        let redis = RedisServer::start().await;
        let mut config = Config::new(redis.url());
        config.listen = "127.0.0.1:0".parse().expect("literal");
        let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
        let stream = StreamName::new("bench").expect("name");
        let group = GroupName::new("g").expect("name");
        let timings = GroupTimings::default();
        let create = CreateGroupRequest {
            shard_count: Some(SHARDS),
            timings: Some(timings),
        };
        coord
            .coordinator()
            .create_group(&stream, &group, &create)
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
        Bench {
            redis,
            coord,
            stream,
            group,
            timings,
            url,
            http,
        }
    }

    /// The group's revision and aggregate size.
    async fn revision(&self, conn: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
        let key = protocol::keys::group_metadata(&self.stream, &self.group);
        redis::pipe()
            .hget(&key, "revision")
            .cmd("HSTRLEN")
            .arg(&key)
            .arg("aggregate")
            .query_async(conn)
            .await
            .expect("revision")
    }

    /// Joins every member and converges (revokes acked at once).
    async fn join_all(&self) -> (Vec<Member>, Duration) {
        let mut members: Vec<Member> = (0..MEMBERS).map(joining).collect();
        let t = Instant::now();
        for m in &mut members {
            let r = send(&self.http, &self.url, &m.req).await;
            apply(m, &r);
        }
        let join_all = t.elapsed();
        for _round in 0..5 {
            for m in &mut members {
                let r = send(&self.http, &self.url, &m.req).await;
                apply(m, &r);
            }
        }
        let owned: usize = members.iter().map(|m| m.req.owned.len()).sum();
        assert_eq!(
            owned, SHARDS as usize,
            "every shard read by exactly one member after converging"
        );
        (members, join_all)
    }

    /// Phase A: every member every heartbeat interval, for `phase`; the sorted latencies.
    async fn default_rate(&self, members: &[Arc<Mutex<Member>>], phase: Duration) -> Vec<Duration> {
        let interval = Duration::from_millis(self.timings.heartbeat_interval_ms);
        let started = Instant::now();
        let mut tasks = Vec::new();
        for (i, m) in members.iter().enumerate() {
            let (m, http, url) = (m.clone(), self.http.clone(), self.url.clone());
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
        lat.sort();
        lat
    }

    /// Phase B: as fast as 64 concurrent callers can go, for `phase`; heartbeats per second.
    async fn max_rate(&self, members: &[Arc<Mutex<Member>>], phase: Duration) -> f64 {
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..64 {
            let (members, http, url) = (members.to_vec(), self.http.clone(), self.url.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                let mut i = w;
                while started.elapsed() < phase {
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
        total as f64 / started.elapsed().as_secs_f64()
    }
}

/// A member about to join.
fn joining(i: usize) -> Member {
    Member {
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
    }
}

/// The raw Redis round trip p50, same process, same moment.
async fn raw_round_trip(conn: &mut redis::aio::MultiplexedConnection) -> Duration {
    let mut rtts = Vec::with_capacity(2_000);
    for _ in 0..2_000 {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(conn).await.expect("PING");
        rtts.push(t.elapsed());
    }
    rtts.sort();
    percentile(&rtts, 0.5)
}

/// What phase A measured.
struct Steady {
    latencies: Vec<Duration>,
    phase: Duration,
    commands: u64,
    aggregate_writes: u64,
    aggregate_bytes: u64,
}

fn report(join_all: Duration, a: &Steady, max_rate: f64, rtt_p50: Duration) {
    let beats = a.latencies.len() as u64;
    let p50 = percentile(&a.latencies, 0.5);
    let p99 = percentile(&a.latencies, 0.99);
    println!("## Coordinator steady state ({MEMBERS} members, {SHARDS} shards, default timings)");
    println!("| figure | value | goal |");
    println!("|---|---:|---:|");
    println!("| join of {MEMBERS} members (sequential) | {:.0} ms | |", ms(join_all));
    println!(
        "| offered rate (phase A) | {:.0} hb/s | |",
        beats as f64 / a.phase.as_secs_f64()
    );
    println!("| heartbeat latency p50 | {:.2} ms | |", ms(p50));
    println!("| heartbeat latency p99 | {:.2} ms | <= 5 ms |", ms(p99));
    println!("| max heartbeats/s (64 concurrent callers) | {max_rate:.0} | >= 5000 |");
    println!(
        "| Redis commands per no-change heartbeat | {:.2} | |",
        a.commands as f64 / beats as f64
    );
    println!("| aggregate writes during phase A | {} | 0 |", a.aggregate_writes);
    println!("| aggregate size | {} bytes | |", a.aggregate_bytes);
    println!("| raw Redis round trip p50 (baseline) | {:.3} ms | |", ms(rtt_p50));
    println!(
        "| heartbeat p50 / (2 x raw round trip) | {:.1} | |",
        p50.as_secs_f64() / (2.0 * rtt_p50.as_secs_f64())
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let bench = Bench::start().await;
    let mut conn = bench.redis.connection().await;
    let rtt_p50 = raw_round_trip(&mut conn).await;
    let (members, join_all) = bench.join_all().await;
    let members: Vec<Arc<Mutex<Member>>> = members.into_iter().map(|m| Arc::new(Mutex::new(m))).collect();

    let phase = Duration::from_secs(10);
    let (rev_before, aggregate_bytes) = bench.revision(&mut conn).await;
    let cmds_before = commandstats_total(&mut conn).await;
    let latencies = bench.default_rate(&members, phase).await;
    let cmds_after = commandstats_total(&mut conn).await;
    let (rev_after, _) = bench.revision(&mut conn).await;
    let steady = Steady {
        latencies,
        phase,
        commands: cmds_after - cmds_before,
        aggregate_writes: rev_after - rev_before,
        aggregate_bytes,
    };
    let max_rate = bench.max_rate(&members, Duration::from_secs(5)).await;
    report(join_all, &steady, max_rate, rtt_p50);
    bench.coord.shutdown().await;
}
