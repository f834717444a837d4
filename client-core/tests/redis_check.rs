//! The Redis capability check against real servers: one that passes, one with a command renamed away in its
//! configuration, and a requirement above the server's version.

use client_core::{check_redis, RedisCheckError, RedisRequirements};
use test_support::RedisServer;

const NEEDS: RedisRequirements = RedisRequirements {
    min_version: client_core::redis_check::MIN_REDIS_VERSION,
    commands: &[
        ("XADD", "publishing"),
        ("XCLAIM", "counting retries"),
        ("CLIENT", "unblocking reads"),
    ],
};

#[tokio::test]
async fn a_complete_server_passes_and_reports_its_version() {
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
    let caps = check_redis(&mut conn, &redis.url(), &NEEDS)
        .await
        .expect("a stock redis-server passes");
    assert!(caps.version.split('.').count() >= 2, "{}", caps.version);
}

#[tokio::test]
async fn a_renamed_command_is_named_with_its_reason_and_the_url_without_password() {
    let redis = RedisServer::builder()
        .rename_command("XCLAIM", "XCLAIM_RENAMED")
        .start()
        .await;
    let mut conn = redis.connection().await;
    let url = format!("redis://default:s3cret@127.0.0.1:{}", redis.port());
    let err = check_redis(&mut conn, &url, &NEEDS)
        .await
        .expect_err("XCLAIM is renamed");
    assert!(err.is_unsupported());
    assert!(matches!(&err, RedisCheckError::MissingCommands { commands, .. } if commands.len() == 1));
    let message = err.to_string();
    assert!(message.contains("XCLAIM (counting retries)"), "{message}");
    assert!(message.contains(&format!("127.0.0.1:{}", redis.port())), "{message}");
    assert!(!message.contains("s3cret"), "{message}");
}

#[tokio::test]
async fn a_server_older_than_required_is_refused() {
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
    let future = RedisRequirements {
        min_version: (99, 0),
        commands: &[],
    };
    let err = check_redis(&mut conn, &redis.url(), &future)
        .await
        .expect_err("no Redis 99 yet");
    assert!(
        matches!(err, RedisCheckError::TooOld { required: (99, 0), .. }),
        "{err}"
    );
    assert!(err.is_unsupported());
}
