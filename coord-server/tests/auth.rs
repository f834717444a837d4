//! Auth and tenants over HTTP, against an in-process coordinator on a real Redis: the `Bearer` scheme in any case,
//! roles (a producer token cannot heartbeat, a consumer token cannot administer), stream-prefix scopes on every
//! route (one tenant's token reaches none of another tenant's groups, and `GET /v1/groups` lists only its own),
//! 401 vs 403, nothing written by a refused request, and the non-loopback start-up rule of the library and of
//! the binary, with tokens read from files and the environment.

mod common;

use common::*;
use coord_server::auth::Grant;
use coord_server::server::CoordinatorHandle;
use coord_server::{Config, Error};
use protocol::messages::{
    AddShardsRequest, CreateGroupRequest, GroupDescription, GroupList, RecreateGroupRequest, RoutingResponse,
};
use protocol::Status;
use reqwest::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode};
use std::process::Stdio;
use std::time::Duration;
use test_support::{free_port, wait_until, RedisServer};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_coord-server");
const WAIT: Duration = Duration::from_secs(20);

const A: &str = "tenant-a.orders";
const B: &str = "tenant-b.orders";
const G: &str = "billing";

/// Two tenants, each with an admin, a consumer and a producer token, plus an operator for every stream.
const TABLE: &str = "\
# tenant a
admin:tenant-a.:admin-a
consumer:tenant-a.:consumer-a
producer:tenant-a.:producer-a
# tenant b
admin:tenant-b.:admin-b
consumer:tenant-b.:consumer-b
producer:tenant-b.:producer-b
admin:*:operator
";

async fn start_with(config: impl FnOnce(&mut Config)) -> (RedisServer, CoordinatorHandle) {
    let redis = RedisServer::start().await;
    let mut c = common::config(&redis.url());
    config(&mut c);
    let coord = CoordinatorHandle::spawn(c).await.expect("coordinator starts");
    (redis, coord)
}

async fn forbidden(resp: reqwest::Response) -> String {
    error_json(resp, StatusCode::FORBIDDEN, Status::Unauthorized)
        .await
        .message
}

fn hb_path(stream: &str) -> String {
    protocol::routes::heartbeat(stream, G)
}

#[tokio::test]
async fn the_bearer_scheme_is_matched_case_insensitively() {
    let (_redis, coord) = start_with(|c| c.admin_token = Some("admin-secret".into())).await;
    let http = reqwest::Client::new();
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let resp = http
            .get(format!("{}{}", coord.url(), protocol::routes::GROUPS))
            .header(AUTHORIZATION, format!("{scheme} admin-secret"))
            .send()
            .await
            .expect("request sent");
        assert_eq!(resp.status(), StatusCode::OK, "scheme {scheme:?}");
    }
    for header in ["Basic admin-secret", "Bearer", "Beareradmin-secret", "admin-secret"] {
        let resp = http
            .get(format!("{}{}", coord.url(), protocol::routes::GROUPS))
            .header(AUTHORIZATION, header)
            .send()
            .await
            .expect("request sent");
        assert_eq!(
            resp.headers().get(WWW_AUTHENTICATE).map(|v| v.as_bytes()),
            Some(&b"Bearer"[..]),
            "{header:?}"
        );
        error_json(resp, StatusCode::UNAUTHORIZED, Status::Unauthorized).await;
    }
    coord.shutdown().await;
}

#[tokio::test]
async fn a_valid_token_without_the_role_gets_403_and_an_unknown_one_401() {
    let (_redis, coord) = start_with(|c| {
        c.admin_token = Some("admin-secret".into());
        c.client_token = Some("client-secret".into());
    })
    .await;
    let admin = Api::new(coord.url()).with_token("admin-secret");
    let client = Api::new(coord.url()).with_token("client-secret");
    admin.create_group("orders", G, 2).await;
    let message = forbidden(client.get("/v1/groups").await).await;
    assert!(message.contains("admin role"), "{message}");
    let message = forbidden(
        admin
            .post("/v1/streams/orders/groups/billing/heartbeat", &join("a"))
            .await,
    )
    .await;
    assert!(message.contains("consumer role"), "{message}");
    let message = forbidden(admin.get("/v1/streams/orders/routing").await).await;
    assert!(message.contains("producer role"), "{message}");
    let wrong = Api::new(coord.url()).with_token("admin-secre");
    error_json(
        wrong.get("/v1/groups").await,
        StatusCode::UNAUTHORIZED,
        Status::Unauthorized,
    )
    .await;
    coord.shutdown().await;
}

#[tokio::test]
async fn tenant_tokens_reach_only_their_prefix_and_role_on_every_route() {
    let (_redis, coord) = start_with(|c| c.tokens = Grant::parse_table(TABLE).expect("table")).await;
    let url = coord.url();
    let token = |t: &str| Api::new(url.clone()).with_token(t);
    let (admin_a, admin_b, operator) = (token("admin-a"), token("admin-b"), token("operator"));
    let (consumer_a, producer_a) = (token("consumer-a"), token("producer-a"));

    // Each tenant creates its own group; neither may create in the other's prefix.
    admin_a.create_group(A, G, 2).await;
    admin_b.create_group(B, G, 2).await;
    let create = CreateGroupRequest {
        shard_count: Some(2),
        timings: Some(timings()),
    };
    let message = forbidden(admin_a.post(&protocol::routes::group(B, "other"), &create).await).await;
    assert!(message.contains(B), "{message}");
    let before: GroupDescription = admin_b.describe(B, G).await;

    // Admin routes of tenant b, with tenant a's admin token: all refused, before the body is read.
    forbidden(
        admin_a
            .post(&protocol::routes::group(B, G), &serde_json::json!({"nonsense": true}))
            .await,
    )
    .await;
    forbidden(admin_a.get(&protocol::routes::group(B, G)).await).await;
    forbidden(admin_a.get(&protocol::routes::stream(B)).await).await;
    forbidden(
        admin_a
            .post(&protocol::routes::shards(B), &AddShardsRequest { count: 1 })
            .await,
    )
    .await;
    let recreate = RecreateGroupRequest {
        confirm: true,
        shard_count: 2,
        timings: None,
    };
    forbidden(admin_a.post(&protocol::routes::recreate(B, G), &recreate).await).await;
    for (method, path) in [
        (Method::POST, protocol::routes::fence(B, G, "m")),
        (Method::DELETE, protocol::routes::member(B, G, "m")),
    ] {
        forbidden(admin_a.request(method, &path).send().await.expect("request sent")).await;
    }

    // Client routes: a consumer token joins only its tenant's groups; a producer token never heartbeats; routing
    // is the producer's, in its own tenant only.
    consumer_a.hb(A, G, &join("a1")).await;
    forbidden(consumer_a.post(&hb_path(B), &join("a1")).await).await;
    forbidden(producer_a.post(&hb_path(A), &join("p1")).await).await;
    forbidden(admin_a.post(&hb_path(A), &join("x1")).await).await;
    ok_json::<RoutingResponse>(producer_a.get(&protocol::routes::routing(A)).await, StatusCode::OK).await;
    forbidden(producer_a.get(&protocol::routes::routing(B)).await).await;
    forbidden(consumer_a.get(&protocol::routes::routing(A)).await).await;
    forbidden(consumer_a.get(&protocol::routes::group(A, G)).await).await;

    // The list is filtered to the token's prefixes; a rebuild (which scans every tenant) needs `*`.
    let listed = |list: GroupList| -> Vec<String> { list.groups.iter().map(|g| g.stream.to_string()).collect() };
    let list_a: GroupList = ok_json(admin_a.get("/v1/groups").await, StatusCode::OK).await;
    assert_eq!(listed(list_a), [A]);
    let list_b: GroupList = ok_json(admin_b.get("/v1/groups").await, StatusCode::OK).await;
    assert_eq!(listed(list_b), [B]);
    forbidden(admin_a.get("/v1/groups?rebuild=true").await).await;
    let all: GroupList = ok_json(operator.get("/v1/groups?rebuild=true").await, StatusCode::OK).await;
    assert_eq!(listed(all), [A, B]);

    // No refused request changed tenant b's group.
    let after = operator.describe(B, G).await;
    assert_eq!(after.revision, before.revision);
    assert!(after.members.is_empty(), "{after:?}");
    // Once a table exists, every API route needs a token; the probes and metrics do not.
    let anonymous = Api::new(url.clone());
    error_json(
        anonymous.post(&hb_path(A), &join("a2")).await,
        StatusCode::UNAUTHORIZED,
        Status::Unauthorized,
    )
    .await;
    assert_eq!(anonymous.get("/readyz").await.status(), StatusCode::OK);
    assert_eq!(anonymous.get("/metrics").await.status(), StatusCode::OK);
    coord.shutdown().await;
}

#[tokio::test]
async fn the_library_refuses_a_non_loopback_listener_without_an_admin_token() {
    let redis = RedisServer::start().await;
    let mut open = common::config(&redis.url());
    open.listen = "0.0.0.0:0".parse().expect("literal address");
    let err = CoordinatorHandle::spawn(open.clone())
        .await
        .expect_err("admin routes open to the network are refused");
    assert!(matches!(err, Error::InvalidRequest(_)), "{err:?}");
    assert!(err.to_string().contains("--insecure-no-admin-token"), "{err}");

    let mut insecure = open.clone();
    insecure.insecure_no_admin_token = true;
    let coord = CoordinatorHandle::spawn(insecure).await.expect("explicitly insecure");
    coord.shutdown().await;
    let mut protected = open;
    protected.admin_token = Some("admin-secret".into());
    let coord = CoordinatorHandle::spawn(protected).await.expect("protected");
    coord.shutdown().await;
}

fn binary(redis: &RedisServer, listen: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["--redis-url", &redis.url(), "--listen", listen])
        // The shared short group timings need a mutex that a 1.5 s lease outlasts.
        .args(["--mutex-ttl-ms", "900", "--critical-section-timeout-ms", "600"])
        .env_remove("RUST_LOG")
        .env_remove("COORD_ADMIN_TOKEN")
        .env_remove("COORD_CLIENT_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn wait_ready(base: &str) {
    let http = reqwest::Client::new();
    wait_until(WAIT, "the binary to answer /readyz", || {
        let http = http.clone();
        let url = format!("{base}/readyz");
        async move { http.get(url).send().await.is_ok_and(|r| r.status().is_success()) }
    })
    .await;
}

#[tokio::test]
async fn the_binary_refuses_a_non_loopback_listener_without_an_admin_token() {
    let redis = RedisServer::start().await;
    let port = free_port();
    let output = tokio::time::timeout(WAIT, binary(&redis, &format!("0.0.0.0:{port}")).output())
        .await
        .expect("the binary exits by itself")
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("--insecure-no-admin-token"), "{stderr}");

    let child = binary(&redis, &format!("0.0.0.0:{port}"))
        .arg("--insecure-no-admin-token")
        .spawn()
        .expect("the binary starts");
    wait_ready(&format!("http://127.0.0.1:{port}")).await;
    drop(child);
}

#[tokio::test]
async fn the_binary_reads_tokens_from_files_and_the_environment() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let admin_file = dir.path().join("admin-token");
    std::fs::write(&admin_file, "admin-from-file\n").expect("write the admin token");
    let table = dir.path().join("tokens");
    std::fs::write(&table, TABLE).expect("write the token table");
    let port = free_port();
    // Non-loopback without the insecure flag: the admin token from the file is what lets it start.
    let child = binary(&redis, &format!("0.0.0.0:{port}"))
        .env("COORD_ADMIN_TOKEN_FILE", &admin_file)
        .env("COORD_CLIENT_TOKEN", "client-from-env")
        .arg("--tokens-file")
        .arg(&table)
        .spawn()
        .expect("the binary starts");
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    let token = |t: &str| Api::new(base.clone()).with_token(t);
    token("admin-from-file").create_group(A, G, 2).await;
    token("client-from-env").hb(A, G, &join("a")).await;
    token("consumer-a").hb(A, G, &join("b")).await;
    forbidden(token("consumer-b").post(&hb_path(A), &join("c")).await).await;
    error_json(
        Api::new(base.clone()).get("/v1/groups").await,
        StatusCode::UNAUTHORIZED,
        Status::Unauthorized,
    )
    .await;
    drop(child);

    // A token table that does not parse stops the start, naming the line but not the token.
    std::fs::write(&table, "admin:*:fine\nreader:*:hunter2\n").expect("write the token table");
    let output = tokio::time::timeout(
        WAIT,
        binary(&redis, "127.0.0.1:0").arg("--tokens-file").arg(&table).output(),
    )
    .await
    .expect("the binary exits by itself")
    .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[tokio::test]
async fn the_binary_never_logs_redis_credentials() {
    // redis-rs refuses these at once, and the start fails with an error naming the URL. (A URL it accepts would
    // name it the same way, after its connection retries; the forms are covered by `redact_url`'s unit tests.)
    for url in [
        "user:hunter2@127.0.0.1:1",
        ":hunter2@127.0.0.1:1",
        "nope://user:hunter2@127.0.0.1:1",
    ] {
        let output = tokio::time::timeout(
            WAIT,
            Command::new(BIN)
                .args(["--redis-url", url, "--listen", "127.0.0.1:0"])
                .env_remove("RUST_LOG")
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("the binary exits by itself")
        .expect("the binary runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{url}: {stderr}");
        assert!(stderr.contains("***@127.0.0.1:1"), "{url}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{url}: {stderr}");
    }
}
