//! The built `coordctl` binary against an in-process coordinator on a real Redis: every subcommand, its `--json`
//! output, and the exit codes of failures.

use coord_server::server::CoordinatorHandle;
use coord_server::Config;
use protocol::messages::{
    CreateGroupRequest, GroupDescription, GroupList, HeartbeatRequest, HeartbeatResponse, RoutingDescription,
};
use protocol::metadata::GroupTimings;
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{MemberEpoch, MetadataVersion, ShardId, Status};
use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;
use test_support::{wait_for, RedisServer};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_coordctl");
const S: &str = "orders";
const G: &str = "billing";
const WAIT: Duration = Duration::from_secs(15);

fn timings() -> GroupTimings {
    GroupTimings {
        member_ttl_ms: 5_000,
        heartbeat_interval_ms: 500,
        rebalance_timeout_ms: 5_000,
        assignment_lease_ms: 4_000,
    }
}

async fn start(admin_token: Option<&str>) -> (RedisServer, CoordinatorHandle) {
    start_ticking(admin_token, Duration::from_millis(50)).await
}

/// A coordinator whose tick loop runs every `tick` (the tick also rebuilds the groups index now and then).
async fn start_ticking(admin_token: Option<&str>, tick: Duration) -> (RedisServer, CoordinatorHandle) {
    let redis = RedisServer::start().await;
    let mut config = Config::new(redis.url());
    config.listen = "127.0.0.1:0".parse().expect("literal address");
    config.tick_interval = tick;
    config.default_timings = timings();
    config.admin_token = admin_token.map(str::to_owned);
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    (redis, coord)
}

/// What one run of the binary printed.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}\nstderr: {}", self.stdout, self.stderr))
    }

    fn decode<T: serde::de::DeserializeOwned>(&self) -> T {
        assert_eq!(self.code, 0, "stdout: {}\nstderr: {}", self.stdout, self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not the expected JSON ({e}): {}", self.stdout))
    }
}

async fn coordctl(url: &str, token: Option<&str>, args: &[&str]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.arg("--url").arg(url).args(args);
    cmd.env_remove("COORD_URL")
        .env_remove("COORD_ADMIN_TOKEN")
        .env_remove("COORD_ADMIN_TOKEN_FILE");
    if let Some(t) = token {
        cmd.env("COORD_ADMIN_TOKEN", t);
    }
    let out = tokio::time::timeout(WAIT, cmd.stdin(Stdio::null()).kill_on_drop(true).output())
        .await
        .expect("coordctl exits by itself")
        .expect("coordctl runs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn create_group(url: &str, token: Option<&str>, shards: u32) {
    let mut rb = reqwest::Client::new()
        .post(format!("{url}{}", protocol::routes::group(S, G)))
        .json(&CreateGroupRequest {
            shard_count: Some(shards),
            timings: Some(timings()),
        });
    if let Some(t) = token {
        rb = rb.bearer_auth(t);
    }
    let resp = rb.send().await.expect("request sent");
    assert_eq!(
        resp.status(),
        reqwest::StatusCode::CREATED,
        "{}",
        resp.text().await.unwrap_or_default()
    );
}

async fn join(url: &str, member: &str) -> HeartbeatResponse {
    let req = HeartbeatRequest {
        member_id: MemberId::new(member).expect("member id"),
        instance_id: format!("{member}-i"),
        incarnation: protocol::Incarnation::NONE,
        member_epoch: MemberEpoch::JOIN,
        metadata_version: MetadataVersion(0),
        max_observed_version: MetadataVersion(0),
        owned: Vec::new(),
        revoking: Vec::new(),
        max_routing_version: protocol::RoutingVersion(0),
        max_shard_count: 0,
    };
    let resp = reqwest::Client::new()
        .post(format!("{url}{}", protocol::routes::heartbeat(S, G)))
        .json(&req)
        .send()
        .await
        .expect("request sent");
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    resp.json().await.expect("HeartbeatResponse")
}

fn key(shard: u32) -> String {
    protocol::keys::shard_stream(&StreamName::new(S).expect("stream"), ShardId(shard))
}

#[tokio::test]
async fn groups_lists_and_rebuilds_the_index() {
    // No tick during the test: the tick loop rebuilds a lost index by itself, which would race the check below.
    let (redis, coord) = start_ticking(None, Duration::from_secs(3600)).await;
    let url = coord.url();
    let list: GroupList = coordctl(&url, None, &["groups", "--json"]).await.decode();
    assert!(list.groups.is_empty());
    create_group(&url, None, 2).await;
    let list: GroupList = coordctl(&url, None, &["groups", "--json"]).await.decode();
    assert_eq!(list.groups.len(), 1);
    assert_eq!(list.groups[0].group, GroupName::new(G).expect("group"));

    // The index is rebuildable: lose it, then rebuild by SCAN.
    let mut conn = redis.connection().await;
    let _: i64 = redis::cmd("DEL")
        .arg(protocol::keys::groups_index())
        .query_async(&mut conn)
        .await
        .expect("DEL index");
    let list: GroupList = coordctl(&url, None, &["groups", "--json"]).await.decode();
    assert!(list.groups.is_empty(), "the index is gone");
    let human = coordctl(&url, None, &["groups"]).await;
    assert!(human.stdout.contains("--rebuild"), "{}", human.stdout);
    let list: GroupList = coordctl(&url, None, &["groups", "--rebuild", "--json"]).await.decode();
    assert_eq!(list.groups.len(), 1);
    let human = coordctl(&url, None, &["groups"]).await;
    assert_eq!(human.code, 0);
    assert!(
        human.stdout.starts_with("STREAM") && human.stdout.contains(G),
        "{}",
        human.stdout
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn describe_shows_members_shards_and_lag() {
    let (redis, coord) = start(None).await;
    let url = coord.url();
    create_group(&url, None, 2).await;
    let a = join(&url, "a").await;
    assert_eq!(a.status, Status::Ok);
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(key(1))
        .arg(G)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .expect("XGROUP CREATE");
    for _ in 0..4 {
        let _: String = redis::cmd("XADD")
            .arg(key(1))
            .arg("*")
            .arg("k")
            .arg("v")
            .query_async(&mut conn)
            .await
            .expect("XADD");
    }
    // XINFO GROUPS reports `lag` from Redis 7 on; with 6.2 (the binary scripts/ensure-redis.sh provides where no
    // package can be installed) the shard's row is there without it.
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let major: u32 = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| v.split('.').next()?.trim().parse().ok())
        .expect("redis_version in INFO");
    let expected_lag = (major >= 7).then_some(4);
    let v = wait_for(WAIT, "describe with lag 4 on shard 1", || {
        let url = url.clone();
        async move {
            let run = coordctl(&url, None, &["describe", S, G, "--json"]).await;
            let v = run.json();
            let row = v["lag"].as_array()?.iter().find(|l| l["shard"] == 1)?.clone();
            (row["lag"].as_u64() == expected_lag).then_some(v)
        }
    })
    .await;
    let group: GroupDescription = serde_json::from_value(v["group"].clone()).expect("GroupDescription");
    assert_eq!(group.members.len(), 1);
    assert_eq!(group.members[0].member_id.as_str(), "a");
    assert_eq!(group.members[0].epoch, a.member_epoch);
    assert_eq!(group.shards.len(), 2);
    assert!(group.shards.iter().all(|s| s.owner == s.target && s.owner.is_some()));
    assert!(group.correction.is_none());

    let human = coordctl(&url, None, &["describe", S, G]).await;
    assert_eq!(human.code, 0, "{}", human.stderr);
    for needle in [
        "MEMBER",
        "LEASE LEFT",
        "SHARD",
        "TARGET",
        "OWNER",
        "LAG",
        "correction round: none",
    ] {
        assert!(human.stdout.contains(needle), "{needle}: {}", human.stdout);
    }

    let missing = coordctl(&url, None, &["describe", S, "nosuch", "--json"]).await;
    assert_eq!(missing.code, 1, "{}", missing.stderr);
    assert!(missing.stderr.contains("NOT_FOUND"), "{}", missing.stderr);
    assert_eq!(missing.json()["httpStatus"], 404);
    assert_eq!(missing.json()["error"]["status"], "NOT_FOUND");
    coord.shutdown().await;
}

#[tokio::test]
async fn routing_and_add_shards_with_if_match() {
    let (_redis, coord) = start(None).await;
    let url = coord.url();
    create_group(&url, None, 2).await;
    let routing: RoutingDescription = coordctl(&url, None, &["routing", S, "--json"]).await.decode();
    assert_eq!(routing.shard_count, 2);

    let stale = coordctl(
        &url,
        None,
        &[
            "add-shards",
            S,
            "2",
            "--if-match",
            &(routing.revision.0 + 7).to_string(),
            "--json",
        ],
    )
    .await;
    assert_eq!(stale.code, 1, "{}", stale.stderr);
    assert!(stale.stderr.contains("REVISION_CONFLICT"), "{}", stale.stderr);
    assert_eq!(stale.json()["httpStatus"], 412);

    let rev = routing.revision.0.to_string();
    let grown: RoutingDescription = coordctl(&url, None, &["add-shards", S, "2", "--if-match", &rev, "--json"])
        .await
        .decode();
    assert_eq!(grown.shard_count, 4);
    assert!(grown.routing_version > routing.routing_version);
    let again = coordctl(&url, None, &["add-shards", S, "2", "--if-match", &rev]).await;
    assert_eq!(
        again.code, 1,
        "a retry with the old revision adds nothing: {}",
        again.stdout
    );

    let human = coordctl(&url, None, &["routing", S]).await;
    assert!(human.stdout.contains("shards 4"), "{}", human.stdout);
    let none = coordctl(&url, None, &["routing", "nostream"]).await;
    assert_eq!(none.code, 1);
    coord.shutdown().await;
}

#[tokio::test]
async fn fence_marks_the_member_and_checks_if_match() {
    let (_redis, coord) = start(None).await;
    let url = coord.url();
    create_group(&url, None, 2).await;
    join(&url, "a").await;
    let before: Value = coordctl(&url, None, &["describe", S, G, "--json"]).await.json();
    let rev = before["group"]["revision"].as_u64().expect("revision");

    let stale = coordctl(&url, None, &["fence", S, G, "a", "--if-match", &(rev + 1).to_string()]).await;
    assert_eq!(stale.code, 1);
    assert!(stale.stderr.contains("REVISION_CONFLICT"), "{}", stale.stderr);

    let fenced: GroupDescription = coordctl(
        &url,
        None,
        &["fence", S, G, "a", "--if-match", &rev.to_string(), "--json"],
    )
    .await
    .decode();
    assert!(
        fenced.members.iter().any(|m| m.member_id.as_str() == "a" && m.fenced),
        "{fenced:?}"
    );
    let unknown = coordctl(&url, None, &["fence", S, G, "ghost"]).await;
    assert_eq!(unknown.code, 1);
    assert!(unknown.stderr.contains("UNKNOWN_MEMBER"), "{}", unknown.stderr);
    coord.shutdown().await;
}

#[tokio::test]
async fn recreate_refuses_without_yes_and_recreates_a_lost_group() {
    let (redis, coord) = start(None).await;
    let url = coord.url();
    create_group(&url, None, 2).await;

    let exists = coordctl(&url, None, &["recreate", S, G, "--shards", "2", "--yes"]).await;
    assert_eq!(exists.code, 1, "the group exists: {}", exists.stdout);
    assert!(exists.stderr.contains("ALREADY_EXISTS"), "{}", exists.stderr);

    let mut conn = redis.connection().await;
    let meta = protocol::keys::group_metadata(&StreamName::new(S).expect("s"), &GroupName::new(G).expect("g"));
    let _: i64 = redis::cmd("DEL").arg(&meta).query_async(&mut conn).await.expect("DEL");

    let plan = coordctl(&url, None, &["recreate", S, G, "--shards", "2"]).await;
    assert_eq!(plan.code, 4, "{}", plan.stderr);
    assert!(
        plan.stdout.contains("PLAN") && plan.stdout.contains("--yes"),
        "{}",
        plan.stdout
    );
    assert!(
        plan.stdout.contains("METADATA_UNAVAILABLE"),
        "the plan shows the current state: {}",
        plan.stdout
    );
    let partial = coordctl(
        &url,
        None,
        &["recreate", S, G, "--shards", "2", "--member-ttl-ms", "5000", "--yes"],
    )
    .await;
    assert_eq!(partial.code, 4, "all four timings or none: {}", partial.stderr);
    let still_missing = coordctl(&url, None, &["describe", S, G]).await;
    assert_eq!(still_missing.code, 1, "nothing was recreated without --yes");

    let t = timings();
    let recreated: GroupDescription = coordctl(
        &url,
        None,
        &[
            "recreate",
            S,
            G,
            "--shards",
            "2",
            "--member-ttl-ms",
            &t.member_ttl_ms.to_string(),
            "--heartbeat-interval-ms",
            &t.heartbeat_interval_ms.to_string(),
            "--rebalance-timeout-ms",
            &t.rebalance_timeout_ms.to_string(),
            "--assignment-lease-ms",
            &t.assignment_lease_ms.to_string(),
            "--yes",
            "--json",
        ],
    )
    .await
    .decode();
    assert_eq!(recreated.shard_count, 2);
    assert_eq!(recreated.timings, t);
    assert!(
        recreated.correction.is_some(),
        "a recreated group starts with a correction round"
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn the_admin_token_is_sent_and_failures_exit_nonzero() {
    let (_redis, coord) = start(Some("admin-secret")).await;
    let url = coord.url();
    create_group(&url, Some("admin-secret"), 2).await;
    let anonymous = coordctl(&url, None, &["groups"]).await;
    assert_eq!(anonymous.code, 1);
    assert!(anonymous.stderr.contains("UNAUTHORIZED"), "{}", anonymous.stderr);
    let list: GroupList = coordctl(&url, Some("admin-secret"), &["groups", "--json"])
        .await
        .decode();
    assert_eq!(list.groups.len(), 1);
    let flag = coordctl(&url, None, &["--token", "admin-secret", "routing", S, "--json"]).await;
    assert_eq!(flag.code, 0, "{}", flag.stderr);
    let dir = tempfile::tempdir().expect("temp dir");
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, "admin-secret\n").expect("write the token file");
    let token_file = token_file.to_string_lossy().into_owned();
    let file = coordctl(&url, None, &["--token-file", &token_file, "groups", "--json"]).await;
    assert_eq!(file.code, 0, "{}", file.stderr);

    let usage = coordctl(&url, None, &["fence", S]).await;
    assert_eq!(usage.code, 2, "usage errors are clap's 2: {}", usage.stderr);
    coord.shutdown().await;

    let unreachable = coordctl("http://127.0.0.1:9", None, &["groups"]).await;
    assert_eq!(unreachable.code, 3, "{}", unreachable.stderr);
    assert!(unreachable.stderr.contains("cannot reach"), "{}", unreachable.stderr);
}

#[tokio::test]
async fn create_makes_the_group_and_refuses_a_second_time() {
    let (_redis, coord) = start(None).await;
    let url = coord.url();
    let t = timings();
    let args = [
        "create",
        S,
        G,
        "--shards",
        "3",
        "--member-ttl-ms",
        &t.member_ttl_ms.to_string(),
        "--heartbeat-interval-ms",
        &t.heartbeat_interval_ms.to_string(),
        "--rebalance-timeout-ms",
        &t.rebalance_timeout_ms.to_string(),
        "--assignment-lease-ms",
        &t.assignment_lease_ms.to_string(),
    ];
    let human = coordctl(&url, None, &args).await;
    assert_eq!(human.code, 0, "{}", human.stderr);
    assert!(
        human.stdout.starts_with("created") && human.stdout.contains("shards 3"),
        "{}",
        human.stdout
    );
    let described: Value = coordctl(&url, None, &["describe", S, G, "--json"]).await.json();
    let group: GroupDescription = serde_json::from_value(described["group"].clone()).expect("GroupDescription");
    assert_eq!(group.shard_count, 3);
    assert_eq!(group.timings, t);

    let again = coordctl(&url, None, &["create", S, G, "--json"]).await;
    assert_eq!(again.code, 1, "{}", again.stdout);
    assert!(again.stderr.contains("ALREADY_EXISTS"), "{}", again.stderr);

    let partial = coordctl(&url, None, &["create", S, "other", "--member-ttl-ms", "5000"]).await;
    assert_eq!(partial.code, 4, "all four timings or none: {}", partial.stderr);
    let other: GroupDescription = coordctl(&url, None, &["create", S, "other", "--json"]).await.decode();
    assert_eq!(other.shard_count, 3, "the stream's routing is reused");
    coord.shutdown().await;
}

#[tokio::test]
async fn group_tables_after_fence_and_create_show_the_lag_the_metrics_page_has() {
    let (_redis, coord) = start(None).await;
    let url = coord.url();
    let metrics = reqwest::get(format!("{url}{}", protocol::routes::METRICS))
        .await
        .expect("GET /metrics");
    assert_eq!(
        metrics.status(),
        reqwest::StatusCode::OK,
        "the premise: /metrics is readable"
    );
    let created = coordctl(&url, None, &["create", S, G, "--shards", "2"]).await;
    assert_eq!(created.code, 0, "{}", created.stderr);
    assert!(!created.stdout.contains("not readable"), "{}", created.stdout);
    join(&url, "a").await;
    let fenced = coordctl(&url, None, &["fence", S, G, "a"]).await;
    assert_eq!(fenced.code, 0, "{}", fenced.stderr);
    assert!(fenced.stdout.contains("LAG"), "{}", fenced.stdout);
    assert!(!fenced.stdout.contains("not readable"), "{}", fenced.stdout);

    // A coordinator that is down: the error names each cause once.
    coord.shutdown().await;
    let down = coordctl(&url, None, &["fence", S, G, "a"]).await;
    assert_eq!(down.code, 3, "{}", down.stderr);
    assert_eq!(
        down.stderr.matches("Connection refused").count(),
        1,
        "each cause once: {}",
        down.stderr
    );
}

#[tokio::test]
async fn keys_prints_a_shards_keys_and_slot_without_a_coordinator() {
    // Nothing listens on this URL: `keys` asks no one.
    let run = coordctl("http://127.0.0.1:1", None, &["--json", "keys", S, "5"]).await;
    let v = run.decode::<Value>();
    assert_eq!(v["shardStream"], key(5));
    let stream = StreamName::new(S).expect("stream");
    assert_eq!(v["deadLetter"], protocol::keys::dead_letter_stream(&stream, ShardId(5)));
    assert_eq!(v["fence"], protocol::keys::shard_fence(&stream, ShardId(5)));
    assert_eq!(v["slot"], protocol::keys::shard_slot(&stream, ShardId(5)));
    let human = coordctl("http://127.0.0.1:1", None, &["keys", S, "5"]).await;
    assert_eq!(human.code, 0, "{}", human.stderr);
    assert!(human.stdout.contains(&key(5)), "{}", human.stdout);
    let bad = coordctl("http://127.0.0.1:1", None, &["keys", "no spaces", "5"]).await;
    assert_eq!(bad.code, 4, "a bad stream name is refused: {}", bad.stderr);
}

#[tokio::test]
async fn quota_shows_the_tokens_limits_and_usage() {
    let redis = RedisServer::start().await;
    let mut config = Config::new(redis.url());
    config.listen = "127.0.0.1:0".parse().expect("literal address");
    config.default_timings = timings();
    config.tokens = coord_server::auth::Grant::parse_table("admin:tenant-a.:admin-a name=tenant-a groups=3 shards=16")
        .expect("table");
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    let url = coord.url();
    let created = coordctl(
        &url,
        Some("admin-a"),
        &["create", "tenant-a.orders", G, "--shards", "4"],
    )
    .await;
    assert_eq!(created.code, 0, "{}", created.stderr);
    let q: protocol::messages::QuotaDescription = coordctl(&url, Some("admin-a"), &["quota", "--json"]).await.decode();
    assert_eq!(q.token, "tenant-a");
    assert_eq!((q.groups.used, q.groups.limit), (1, 3));
    assert_eq!((q.shards_per_group.used, q.shards_per_group.limit), (4, 16));
    let human = coordctl(&url, Some("admin-a"), &["quota"]).await;
    assert_eq!(human.code, 0, "{}", human.stderr);
    assert!(
        human.stdout.contains("token tenant-a") && human.stdout.contains("groups"),
        "{}",
        human.stdout
    );
    // Past the shard quota: refused with the typed status, exit 1.
    let refused = coordctl(&url, Some("admin-a"), &["create", "tenant-a.big", G, "--shards", "17"]).await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("QUOTA_EXCEEDED"), "{}", refused.stderr);
    coord.shutdown().await;
}
