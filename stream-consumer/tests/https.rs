//! The consumer over HTTPS (issue 40): it joins a coordinator that serves TLS with a private CA it is given, and
//! one that does not trust the coordinator's certificate stops with an error naming the URL and the cause
//! instead of retrying forever.

use client_core::TlsOptions;
use coord_server::server::CoordinatorHandle;
use coord_server::ServerTls;
use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, StreamName};
use std::time::Duration;
use stream_consumer::{CancellationToken, ConsumerBuilder, ConsumerError, Message};
use test_support::consumer::wait_status;
use test_support::pki::TestCa;
use test_support::RedisServer;

const DEADLINE: Duration = Duration::from_secs(15);

struct Env {
    redis: RedisServer,
    coord: CoordinatorHandle,
    ca: TestCa,
}

async fn https_env(name: &str) -> Env {
    let redis = RedisServer::start().await;
    let ca = TestCa::new("coordinator CA");
    let server = ca.server("coordinator");
    let mut config = test_support::coordinator::config(&redis.url(), test_support::coordinator::any_port());
    config.tls = Some(ServerTls::new(&server.cert, &server.key));
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    coord
        .coordinator()
        .create_group(
            &StreamName::new(format!("{name}-stream")).unwrap(),
            &GroupName::new(format!("{name}-group")).unwrap(),
            &CreateGroupRequest {
                shard_count: Some(2),
                timings: Some(test_support::timings::group_timings()),
            },
        )
        .await
        .expect("group created");
    Env { redis, coord, ca }
}

fn consumer(env: &Env, name: &str) -> ConsumerBuilder {
    test_support::consumer::builder(&format!("{name}-stream"), &format!("{name}-group"), "a")
        .coordinator(env.coord.url())
        .redis(env.redis.url())
        .handler(|_msg: Message| async { Ok::<_, std::io::Error>(()) })
}

#[tokio::test]
async fn a_consumer_joins_over_https_with_the_ca_it_is_given() {
    let env = https_env("tls-join").await;
    assert!(env.coord.url().starts_with("https://"), "{}", env.coord.url());
    let handle = consumer(&env, "tls-join")
        .coordinator_tls(TlsOptions::new().ca_file(&env.ca.ca_file))
        .build()
        .expect("valid configuration")
        .start()
        .await
        .expect("starts");
    let status = wait_status(&handle, DEADLINE, "joined and reading both shards", |s| {
        s.joined && s.reading.len() == 2
    })
    .await;
    assert_eq!(status.heartbeats.failed, 0, "{status:?}");
    handle.close().await.expect("closes");
}

#[tokio::test]
async fn a_consumer_that_does_not_trust_the_certificate_stops_naming_the_url_and_the_cause() {
    let env = https_env("tls-untrusted").await;
    let other = TestCa::new("another CA");
    let run = tokio::time::timeout(
        DEADLINE,
        consumer(&env, "tls-untrusted")
            .coordinator_tls(TlsOptions::new().ca_file(&other.ca_file))
            .build()
            .expect("valid configuration")
            .run(CancellationToken::new()),
    )
    .await
    .expect("run returns instead of retrying forever");
    let err = run.expect_err("the certificate is not trusted");
    assert!(matches!(&err, ConsumerError::Coordinator(_)), "{err:?}");
    assert!(!err.is_retryable(), "{err}");
    let text = err.to_string();
    let url = env.coord.url();
    assert!(text.contains(&url), "names the URL {url}: {text}");
    assert!(text.contains("certificate"), "names the cause: {text}");
}

#[tokio::test]
async fn a_missing_ca_file_is_refused_at_build() {
    let err = stream_consumer::Consumer::builder("s", "g")
        .coordinator("https://127.0.0.1:7400")
        .redis("redis://127.0.0.1:6379")
        .coordinator_tls(TlsOptions::new().ca_file("/nonexistent/ca.pem"))
        .handler(|_msg: Message| async { Ok::<_, std::io::Error>(()) })
        .build()
        .expect_err("the CA file does not exist");
    assert!(
        matches!(err, stream_consumer::ConfigError::CoordinatorTls(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
}
