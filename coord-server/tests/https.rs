//! The coordinator over HTTPS (issue 40): `Config::tls` serves the API with TLS, the probe listener stays plain,
//! client certificates are required with a client CA, and a rotated certificate is served to new connections
//! without a restart (on a change of the files, or on SIGHUP).

use client_core::admin::{AdminClient, AdminError};
use client_core::TlsOptions;
use coord_server::server::CoordinatorHandle;
use coord_server::{Config, ServerTls};
use std::time::Duration;
use test_support::pki::{CertFiles, TestCa};
use test_support::{wait_until, RedisServer};

const DEADLINE: Duration = Duration::from_secs(15);

fn tls_config(redis: &RedisServer, tls: ServerTls) -> Config {
    let mut config = test_support::coordinator::config(&redis.url(), test_support::coordinator::any_port());
    config.tls = Some(tls);
    config
}

fn admin(coord: &CoordinatorHandle, tls: TlsOptions) -> AdminClient {
    AdminClient::new(&coord.url(), None, Duration::from_secs(5))
        .expect("admin client")
        .coordinator_tls(tls)
        .expect("TLS settings")
}

/// Whether a new connection trusting only `ca` gets an answer.
async fn answers_with(coord: &CoordinatorHandle, ca: &TestCa) -> bool {
    admin(coord, TlsOptions::new().ca_file(&ca.ca_file))
        .list_groups(false)
        .await
        .is_ok()
}

#[tokio::test]
async fn the_api_is_served_over_https_and_the_probe_listener_stays_plain() {
    let redis = RedisServer::start().await;
    let ca = TestCa::new("coordinator CA");
    let server = ca.server("coordinator");
    let mut config = tls_config(&redis, ServerTls::new(&server.cert, &server.key));
    config.probe_listen = Some(test_support::coordinator::any_port());
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    assert!(coord.url().starts_with("https://"), "{}", coord.url());
    assert!(answers_with(&coord, &ca).await, "a client trusting the CA is answered");

    let plain = reqwest::get(format!("http://{}/healthz", coord.addr())).await;
    assert!(plain.is_err(), "plain HTTP on the TLS port is not answered: {plain:?}");

    let probe = format!("http://{}/healthz", coord.probe_addr().expect("probe listener"));
    let resp = reqwest::get(&probe)
        .await
        .expect("the probe listener answers plain HTTP");
    assert!(resp.status().is_success(), "{}", resp.status());
    coord.shutdown().await;
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_certificate_gets_a_tls_error_naming_the_url() {
    let redis = RedisServer::start().await;
    let ca = TestCa::new("coordinator CA");
    let server = ca.server("coordinator");
    let coord = CoordinatorHandle::spawn(tls_config(&redis, ServerTls::new(&server.cert, &server.key)))
        .await
        .expect("coordinator starts");
    let err = admin(&coord, TlsOptions::new())
        .list_groups(false)
        .await
        .expect_err("the system's roots do not hold the test CA");
    let AdminError::Tls { url, reason, .. } = &err else {
        panic!("expected a TLS error, got {err:?}");
    };
    assert_eq!(url, &coord.url());
    assert!(reason.contains("certificate"), "{reason}");
    assert!(err.to_string().contains(&coord.url()), "{err}");
    coord.shutdown().await;
}

#[tokio::test]
async fn a_bad_certificate_file_is_refused_at_start() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.pem");
    let err = CoordinatorHandle::spawn(tls_config(&redis, ServerTls::new(&missing, &missing)))
        .await
        .expect_err("the certificate file does not exist");
    assert!(matches!(err, coord_server::Error::Tls(_)), "{err:?}");
    assert!(err.to_string().contains("missing.pem"), "{err}");
}

#[tokio::test]
async fn client_certificates_are_required_with_a_client_ca() {
    let redis = RedisServer::start().await;
    let ca = TestCa::new("coordinator CA");
    let clients = TestCa::new("client CA");
    let strangers = TestCa::new("stranger CA");
    let server = ca.server("coordinator");
    let coord = CoordinatorHandle::spawn(tls_config(
        &redis,
        ServerTls::new(&server.cert, &server.key).client_ca(&clients.ca_file),
    ))
    .await
    .expect("coordinator starts");
    let trust = || TlsOptions::new().ca_file(&ca.ca_file);

    let none = admin(&coord, trust()).list_groups(false).await;
    assert!(none.is_err(), "no client certificate: refused, got {none:?}");

    let stranger = strangers.client("stranger");
    let foreign = admin(&coord, trust().client_identity(&stranger.cert, &stranger.key))
        .list_groups(false)
        .await;
    assert!(
        foreign.is_err(),
        "a certificate of another CA: refused, got {foreign:?}"
    );

    let app = clients.client("app");
    admin(&coord, trust().client_identity(&app.cert, &app.key))
        .list_groups(false)
        .await
        .expect("a certificate of the client CA is accepted");
    coord.shutdown().await;
}

/// A coordinator serving `files` (a certificate of `first`), checking them for a change every `interval`.
async fn rotating(redis: &RedisServer, files: &CertFiles, interval: Duration) -> CoordinatorHandle {
    let mut config = tls_config(redis, ServerTls::new(&files.cert, &files.key));
    config.tls_reload_interval = interval;
    CoordinatorHandle::spawn(config).await.expect("coordinator starts")
}

#[tokio::test]
async fn a_replaced_certificate_is_served_to_new_connections_without_a_restart() {
    let redis = RedisServer::start().await;
    let (first, second) = (TestCa::new("first CA"), TestCa::new("second CA"));
    let files = first.server("coordinator");
    let coord = rotating(&redis, &files, Duration::from_millis(100)).await;
    assert!(answers_with(&coord, &first).await);
    assert!(
        !answers_with(&coord, &second).await,
        "not yet the second CA's certificate"
    );

    second.server_into(&files);
    wait_until(DEADLINE, "the second CA's certificate is served", || {
        answers_with(&coord, &second)
    })
    .await;
    assert!(
        !answers_with(&coord, &first).await,
        "the first CA's certificate is gone"
    );
    coord.shutdown().await;
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_reloads_the_certificate_at_once() {
    let redis = RedisServer::start().await;
    let (first, second) = (TestCa::new("first CA"), TestCa::new("second CA"));
    let files = first.server("coordinator");
    // Never on its own within the test: only the signal can make it reload.
    let coord = rotating(&redis, &files, Duration::from_secs(3600)).await;
    // Answered: the server is running, so its SIGHUP handler is installed (a SIGHUP before it would end the
    // test process).
    assert!(answers_with(&coord, &first).await);

    second.server_into(&files);
    assert!(!answers_with(&coord, &second).await, "no reload before the signal");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    wait_until(DEADLINE, "the second CA's certificate is served after SIGHUP", || {
        answers_with(&coord, &second)
    })
    .await;
    coord.shutdown().await;
}
