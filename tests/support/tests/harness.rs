//! Tests of the harness itself, against real `redis-server` processes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult};
use test_support::{free_port, wait_for, wait_until, FaultProxy, Mode, RedisServer, ReplicaPair, Snapshot};
use tokio::time::timeout;

async fn set(con: &mut MultiplexedConnection, key: &str, value: &str) {
    let () = redis::cmd("SET").arg(key).arg(value).query_async(con).await.unwrap();
}

async fn get(con: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(con).await.unwrap()
}

async fn hgetall(con: &mut MultiplexedConnection, key: &str) -> HashMap<String, String> {
    redis::cmd("HGETALL").arg(key).query_async(con).await.unwrap()
}

async fn hset(con: &mut MultiplexedConnection, key: &str, field: &str, value: &str) {
    let _: i64 = redis::cmd("HSET")
        .arg(key)
        .arg(field)
        .arg(value)
        .query_async(con)
        .await
        .unwrap();
}

async fn ping(con: &mut MultiplexedConnection) -> RedisResult<String> {
    redis::cmd("PING").query_async(con).await
}

fn pairs(items: &[(&str, &str)]) -> HashMap<String, String> {
    items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[tokio::test]
async fn start_and_ping() {
    let server = RedisServer::start().await;
    assert!(server.is_running());
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    let mut con = server.connection().await;
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");
    let port: String = redis::cmd("CONFIG")
        .arg("GET")
        .arg("port")
        .query_async::<Vec<String>>(&mut con)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(port, server.port().to_string());
    let dir: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("dir")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        std::path::Path::new(&dir[1]).canonicalize().unwrap(),
        server.dir().canonicalize().unwrap()
    );
    assert!(server.log().contains("Ready to accept connections"), "{}", server.log());

    let mut manager = server.connection_manager().await;
    let pong: String = redis::cmd("PING").query_async(&mut manager).await.unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test]
async fn two_servers_get_different_ports_and_data() {
    let a = RedisServer::start().await;
    let b = RedisServer::start().await;
    assert_ne!(a.port(), b.port());
    assert_ne!(a.dir(), b.dir());
    let mut con_a = a.connection().await;
    let mut con_b = b.connection().await;
    set(&mut con_a, "k", "a").await;
    assert_eq!(get(&mut con_b, "k").await, None);
}

#[tokio::test]
async fn drop_kills_the_process() {
    let server = RedisServer::start().await;
    let pid = server.pid().expect("running server has a pid");
    let port = server.port();
    drop(server);
    #[cfg(target_os = "linux")]
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "redis-server {pid} still exists after drop"
    );
    let _ = pid;
    // Nothing listens on the port any more.
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err());
}

#[tokio::test]
async fn restart_with_persistence_keeps_data() {
    let mut server = RedisServer::builder().persistence(true).start().await;
    let port = server.port();
    let mut con = server.connection().await;
    set(&mut con, "durable", "1").await;

    server.kill();
    assert!(!server.is_running());
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err());
    server.restart().await;
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    let mut con = server.connection().await;
    assert_eq!(get(&mut con, "durable").await.as_deref(), Some("1"));

    // Graceful stop keeps it as well.
    set(&mut con, "durable", "2").await;
    assert!(!server.log().contains("User requested shutdown"));
    server.stop().await;
    assert!(!server.is_running());
    // Stopped gracefully, not killed.
    assert!(server.log().contains("User requested shutdown"), "{}", server.log());
    server.restart().await;
    let mut con = server.connection().await;
    assert_eq!(get(&mut con, "durable").await.as_deref(), Some("2"));
}

#[tokio::test]
async fn restart_without_persistence_loses_data() {
    let mut server = RedisServer::start().await;
    let port = server.port();
    let mut con = server.connection().await;
    set(&mut con, "volatile", "1").await;
    assert_eq!(get(&mut con, "volatile").await.as_deref(), Some("1"));

    server.kill();
    server.restart().await;
    assert_eq!(server.port(), port);
    let mut con = server.connection().await;
    assert_eq!(get(&mut con, "volatile").await, None);

    set(&mut con, "volatile", "2").await;
    server.stop().await;
    server.restart().await;
    let mut con = server.connection().await;
    assert_eq!(get(&mut con, "volatile").await, None);
}

#[tokio::test]
async fn renamed_command_is_unknown() {
    let server = RedisServer::builder()
        .rename_command("XAUTOCLAIM", "")
        .rename_command("XINFO", "XINFO_RENAMED")
        .start()
        .await;
    let mut con = server.connection().await;
    let _: String = redis::cmd("XADD")
        .arg("s")
        .arg("*")
        .arg("f")
        .arg("v")
        .query_async(&mut con)
        .await
        .unwrap();
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("s")
        .arg("g")
        .arg("0")
        .query_async(&mut con)
        .await
        .unwrap();

    let err = redis::cmd("XAUTOCLAIM")
        .arg("s")
        .arg("g")
        .arg("c")
        .arg(0)
        .arg("0")
        .query_async::<redis::Value>(&mut con)
        .await
        .unwrap_err();
    assert!(err.to_string().to_lowercase().contains("unknown command"), "{err}");

    let err = redis::cmd("XINFO")
        .arg("STREAM")
        .arg("s")
        .query_async::<redis::Value>(&mut con)
        .await
        .unwrap_err();
    assert!(err.to_string().to_lowercase().contains("unknown command"), "{err}");
    let _: redis::Value = redis::cmd("XINFO_RENAMED")
        .arg("STREAM")
        .arg("s")
        .query_async(&mut con)
        .await
        .unwrap();

    // A disabled command stays disabled across a restart.
    let mut server = server;
    server.restart().await;
    let mut con = server.connection().await;
    assert!(redis::cmd("XAUTOCLAIM")
        .arg("s")
        .arg("g")
        .arg("c")
        .arg(0)
        .arg("0")
        .query_async::<redis::Value>(&mut con)
        .await
        .is_err());
}

#[tokio::test]
async fn dump_and_restore_roll_a_hash_back() {
    let server = RedisServer::start().await;
    let mut con = server.connection().await;
    hset(&mut con, "meta", "version", "1").await;
    hset(&mut con, "meta", "owner", "a").await;

    let dump = server.dump_key("meta").await.expect("key exists");
    assert_eq!(server.dump_key("missing").await, None);

    hset(&mut con, "meta", "version", "2").await;
    hset(&mut con, "meta", "extra", "x").await;
    assert_eq!(hgetall(&mut con, "meta").await.len(), 3);

    server.restore_key("meta", &dump).await;
    assert_eq!(
        hgetall(&mut con, "meta").await,
        pairs(&[("version", "1"), ("owner", "a")])
    );

    // Restoring into a deleted key recreates it.
    server.delete_key("meta").await;
    assert!(hgetall(&mut con, "meta").await.is_empty());
    server.restore_dump("meta", Some(&dump)).await;
    assert_eq!(hgetall(&mut con, "meta").await.len(), 2);

    // A key that did not exist when dumped is rolled back by deleting it.
    let absent = server.dump_key("created-later").await;
    hset(&mut con, "created-later", "f", "v").await;
    server.restore_dump("created-later", absent.as_deref()).await;
    assert!(hgetall(&mut con, "created-later").await.is_empty());
}

#[tokio::test]
async fn snapshot_restores_matching_keys_only() {
    let server = RedisServer::start().await;
    let mut con = server.connection().await;
    hset(&mut con, "g:1:meta", "version", "1").await;
    hset(&mut con, "g:1:live", "c1", "100").await;
    let _: bool = redis::cmd("PEXPIRE")
        .arg("g:1:live")
        .arg(60_000)
        .query_async(&mut con)
        .await
        .unwrap();
    set(&mut con, "other", "before").await;

    let snapshot: Snapshot = server.snapshot_keys("g:1:*").await;
    assert_eq!(snapshot.pattern(), "g:1:*");
    assert_eq!(snapshot.keys().collect::<Vec<_>>(), vec!["g:1:live", "g:1:meta"]);
    assert!(!snapshot.contains("other"));
    assert_eq!(snapshot.len(), 2);

    hset(&mut con, "g:1:meta", "version", "2").await;
    let _: i64 = redis::cmd("DEL").arg("g:1:live").query_async(&mut con).await.unwrap();
    hset(&mut con, "g:1:new", "f", "v").await;
    set(&mut con, "other", "after").await;

    server.restore_snapshot(&snapshot).await;
    assert_eq!(hgetall(&mut con, "g:1:meta").await, pairs(&[("version", "1")]));
    assert_eq!(hgetall(&mut con, "g:1:live").await, pairs(&[("c1", "100")]));
    let ttl: i64 = redis::cmd("PTTL").arg("g:1:live").query_async(&mut con).await.unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "ttl {ttl}");
    let ttl: i64 = redis::cmd("PTTL").arg("g:1:meta").query_async(&mut con).await.unwrap();
    assert_eq!(ttl, -1, "meta had no expiry");
    assert!(hgetall(&mut con, "g:1:new").await.is_empty());
    assert_eq!(get(&mut con, "other").await.as_deref(), Some("after"));

    // An empty snapshot deletes everything matching.
    let empty = server.snapshot_keys("nothing:*").await;
    assert!(empty.is_empty());
    set(&mut con, "nothing:1", "x").await;
    server.restore_snapshot(&empty).await;
    assert_eq!(get(&mut con, "nothing:1").await, None);
}

#[tokio::test]
async fn promoted_replica_loses_writes_after_the_cut() {
    let pair = ReplicaPair::start().await;
    let mut primary = pair.primary.connection().await;
    let mut replica = pair.replica.connection().await;
    assert!(pair.replica.info("replication").await.contains("role:slave"));

    set(&mut primary, "version", "1").await;
    pair.wait_replicated().await;
    assert_eq!(get(&mut replica, "version").await.as_deref(), Some("1"));

    pair.promote_replica().await;
    assert!(pair.replica.info("replication").await.contains("role:master"));

    set(&mut primary, "version", "2").await;
    assert_eq!(get(&mut primary, "version").await.as_deref(), Some("2"));
    pair.primary.kill();
    assert!(!pair.primary.is_running());

    assert_eq!(get(&mut replica, "version").await.as_deref(), Some("1"));
    // The promoted replica accepts writes.
    set(&mut replica, "version", "3").await;
    assert_eq!(get(&mut replica, "version").await.as_deref(), Some("3"));
}

#[tokio::test]
async fn fault_proxy_pass_stall_reset() {
    let server = RedisServer::start().await;
    let target: SocketAddr = ([127, 0, 0, 1], server.port()).into();
    let proxy = FaultProxy::start(target).await;
    assert_eq!(proxy.mode(), Mode::Pass);
    assert_eq!(proxy.target(), target);
    assert_eq!(proxy.url(), format!("redis://{}", proxy.addr()));

    let client = redis::Client::open(proxy.url()).unwrap();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(None);
    let connect = || client.get_multiplexed_async_connection_with_config(&config);

    // Pass: traffic flows.
    let mut con = connect().await.unwrap();
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");
    set(&mut con, "through-proxy", "yes").await;
    let mut direct = server.connection().await;
    assert_eq!(get(&mut direct, "through-proxy").await.as_deref(), Some("yes"));

    // Stall: no reply, but the connection stays open.
    proxy.set_mode(Mode::Stall);
    assert!(
        timeout(Duration::from_millis(300), ping(&mut con)).await.is_err(),
        "PING answered through a stalled proxy"
    );

    // Back to Pass: the held bytes flow again on the same connection.
    proxy.set_mode(Mode::Pass);
    let pong = timeout(Duration::from_secs(5), ping(&mut con))
        .await
        .expect("PING after un-stalling timed out");
    assert_eq!(pong.unwrap(), "PONG");

    // Reset: the current connection fails, and so do new ones.
    proxy.set_mode(Mode::Reset);
    let result = timeout(Duration::from_secs(5), ping(&mut con))
        .await
        .expect("PING through a reset proxy hung instead of failing");
    assert!(result.is_err(), "PING through a reset proxy: {result:?}");
    let fresh = timeout(Duration::from_secs(5), connect())
        .await
        .expect("connecting through a reset proxy hung");
    assert!(fresh.is_err(), "connected through a reset proxy");

    // Pass again: new connections work.
    proxy.set_mode(Mode::Pass);
    let mut con = connect().await.unwrap();
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");

    // Dropping the proxy closes its listener.
    let addr = proxy.addr();
    drop(proxy);
    wait_until(Duration::from_secs(5), "the proxy listener to close", || async {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
}

#[tokio::test]
async fn wait_for_returns_the_value() {
    let mut calls = 0;
    let value = wait_for(Duration::from_secs(5), "the third call", || {
        calls += 1;
        let n = calls;
        async move { (n >= 3).then_some(n * 10) }
    })
    .await;
    assert_eq!(value, 30);
}

#[tokio::test]
#[should_panic(expected = "timed out after 100ms waiting for something that never happens")]
async fn wait_until_panics_on_timeout() {
    wait_until(Duration::from_millis(100), "something that never happens", || async {
        false
    })
    .await;
}

#[tokio::test]
#[should_panic(expected = "waiting for a check that hangs")]
async fn wait_until_panics_when_a_check_hangs() {
    wait_until(Duration::from_millis(100), "a check that hangs", || {
        std::future::pending::<bool>()
    })
    .await;
}

#[test]
fn free_port_is_bindable() {
    let port = free_port();
    assert_ne!(port, 0);
    std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
}

#[tokio::test]
#[should_panic(expected = "Ready to accept connections")]
async fn harness_panics_include_the_log() {
    let server = RedisServer::start().await;
    server.kill();
    // Fails at once because the server is not running; the message carries
    // the log of the earlier run.
    let _ = server.connection().await;
}

#[tokio::test]
async fn restart_retries_while_the_port_is_taken() {
    let mut server = RedisServer::start().await;
    let port = server.port();
    server.kill();
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(squatter);
    });
    server.restart().await;
    release.await.unwrap();
    assert_eq!(server.port(), port);
    assert!(server.log().contains("Address already in use"), "{}", server.log());
    let mut con = server.connection().await;
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");
}

#[tokio::test]
async fn primary_without_persistence_restarts_empty_after_a_full_sync() {
    // Written before the replica exists, so the full sync's RDB contains it.
    let primary = RedisServer::start().await;
    let mut con = primary.connection().await;
    set(&mut con, "k", "v").await;
    let replica = RedisServer::builder().replica_of(&primary).start().await;
    let mut pair = ReplicaPair { primary, replica };
    let mut replica = pair.replica.connection().await;
    assert_eq!(get(&mut replica, "k").await.as_deref(), Some("v"));

    pair.primary.restart().await;
    let mut primary = pair.primary.connection().await;
    assert_eq!(get(&mut primary, "k").await, None);
    // The replica follows the restarted primary again (and so becomes empty).
    wait_until(Duration::from_secs(5), "the replica to resync", || {
        let mut replica = replica.clone();
        async move { get(&mut replica, "k").await.is_none() }
    })
    .await;
}

#[tokio::test]
async fn extra_args_reach_the_server() {
    let server = RedisServer::builder()
        .extra_arg("--maxmemory")
        .extra_arg("12345678")
        .start()
        .await;
    let mut con = server.connection().await;
    let reply: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(reply, vec!["maxmemory".to_owned(), "12345678".to_owned()]);
}

#[tokio::test]
#[should_panic(expected = "no-such-option")]
async fn start_up_failure_panics_with_the_error_output() {
    RedisServer::builder()
        .extra_arg("--no-such-option")
        .extra_arg("1")
        .start()
        .await;
}
