//! The producer over HTTPS (issue 40): routing from a coordinator that serves TLS with a private CA the producer
//! is given; a producer that does not trust the certificate gets a final error from `ready()` at once, naming the
//! URL and the cause.

use client_core::TlsOptions;
use coord_server::server::CoordinatorHandle;
use coord_server::ServerTls;
use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, StreamName};
use std::time::{Duration, Instant};
use stream_producer::Producer;
use test_support::pki::TestCa;
use test_support::RedisServer;

async fn https_coordinator(redis: &RedisServer, ca: &TestCa, stream: &str) -> CoordinatorHandle {
    let server = ca.server("coordinator");
    let mut config = test_support::coordinator::config(&redis.url(), test_support::coordinator::any_port());
    config.tls = Some(ServerTls::new(&server.cert, &server.key));
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    coord
        .coordinator()
        .create_group(
            &StreamName::new(stream).unwrap(),
            &GroupName::new("g").unwrap(),
            &CreateGroupRequest {
                shard_count: Some(3),
                timings: None,
            },
        )
        .await
        .expect("group created");
    coord
}

#[tokio::test]
async fn a_producer_fetches_routing_over_https_with_the_ca_it_is_given() {
    let redis = RedisServer::start().await;
    let ca = TestCa::new("coordinator CA");
    let coord = https_coordinator(&redis, &ca, "tls-orders").await;
    let producer = Producer::builder("tls-orders")
        .coordinator(coord.url())
        .coordinator_tls(TlsOptions::new().ca_file(&ca.ca_file))
        .redis(redis.url())
        .build()
        .expect("valid configuration");
    let routing = producer.ready().await.expect("routing over https");
    assert_eq!(routing.shard_count, 3, "{routing:?}");
    producer.close().await.expect("closes");
}

#[tokio::test]
async fn a_producer_that_does_not_trust_the_certificate_fails_ready_at_once() {
    let redis = RedisServer::start().await;
    let ca = TestCa::new("coordinator CA");
    let coord = https_coordinator(&redis, &ca, "tls-untrusted").await;
    let other = TestCa::new("another CA");
    let timeout = Duration::from_secs(10);
    let producer = Producer::builder("tls-untrusted")
        .coordinator(coord.url())
        .coordinator_tls(TlsOptions::new().ca_file(&other.ca_file))
        .coordinator_timeout(timeout)
        .redis(redis.url())
        .build()
        .expect("valid configuration");
    let started = Instant::now();
    let err = producer.ready().await.expect_err("the certificate is not trusted");
    assert!(
        started.elapsed() < timeout,
        "a final answer is not retried until the timeout: {:?}",
        started.elapsed()
    );
    let text = format!("{err}: {:?}", err);
    assert!(text.contains(&coord.url()), "names the URL: {text}");
    assert!(text.contains("certificate"), "names the cause: {text}");
}
