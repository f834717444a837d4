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

/// A server with one extra ACL user `limited` (password `pw`): every command except `denied`.
async fn server_with_user_without(denied: &str) -> (RedisServer, redis::aio::MultiplexedConnection, String) {
    let mut builder = RedisServer::builder().extra_arg("--user");
    for word in ["limited", "on", ">pw", "~*", "+@all"] {
        builder = builder.extra_arg(word);
    }
    let redis = builder.extra_arg(format!("-{denied}")).start().await;
    let url = format!("redis://limited:pw@127.0.0.1:{}", redis.port());
    let conn = redis::Client::open(url.as_str())
        .expect("URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect as limited");
    (redis, conn, url)
}

#[tokio::test]
async fn a_user_without_info_passes_the_check() {
    let (_redis, mut conn, url) = server_with_user_without("info").await;
    let caps = check_redis(&mut conn, &url, &NEEDS)
        .await
        .expect("the version comes from HELLO, which no ACL refuses");
    assert!(caps.version.split('.').count() >= 2, "{}", caps.version);
}

#[tokio::test]
async fn a_user_without_command_info_is_told_which_permission_is_missing() {
    let (_redis, mut conn, url) = server_with_user_without("command|info").await;
    let err = check_redis(&mut conn, &url, &NEEDS)
        .await
        .expect_err("COMMAND INFO is refused");
    assert!(err.is_unsupported());
    let RedisCheckError::NotPermitted { refused, .. } = &err else {
        panic!("expected NotPermitted, got {err:?}");
    };
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].starts_with("COMMAND INFO ("), "{refused:?}");
    assert!(refused[0].contains("NOPERM"), "{refused:?}");
    assert!(!err.to_string().contains(":pw@"), "{err}");
}

#[tokio::test]
async fn permission_probes_name_each_refused_command_and_nothing_else() {
    let (_redis, mut conn, url) = server_with_user_without("watch").await;
    let probe = |name: &str, cmd: redis::Cmd| client_core::PermissionProbe::new(name, cmd);
    let mut watch = redis::cmd("WATCH");
    watch.arg("k");
    let probes = [
        // Refused after the ACL check (no MULTI): permitted.
        probe("EXEC", redis::cmd("EXEC")),
        probe("WATCH k", watch),
        probe("UNWATCH", redis::cmd("UNWATCH")),
    ];
    let err = client_core::check_permissions(&mut conn, &url, &probes)
        .await
        .expect_err("WATCH is refused");
    let RedisCheckError::NotPermitted { refused, .. } = &err else {
        panic!("expected NotPermitted, got {err:?}");
    };
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].starts_with("WATCH k (NOPERM"), "{refused:?}");
    assert!(err.to_string().contains("WATCH k"), "{err}");
}
