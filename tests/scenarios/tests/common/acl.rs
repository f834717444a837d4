//! The shipped ACL file (`deploy/redis/users.acl`) on test servers: its users, their URLs, and what Redis's
//! `ACL LOG` says it refused.
//!
//! Test helpers (readiness checks, admin connections, forming a cluster) connect as the `default` user without a
//! password, so the test's copy turns `default` into an unrestricted user; every other user is the shipped one.

use super::*;
use std::path::{Path, PathBuf};
use test_support::cluster::RedisCluster;

/// A stream of tenant a (`tenant-a.` in the shipped file).
pub const TENANT_A: &str = "tenant-a.orders";
/// A stream of tenant b.
pub const TENANT_B: &str = "tenant-b.orders";

fn shipped() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/redis/users.acl");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The shipped line of `user`.
pub fn shipped_user(user: &str) -> String {
    let prefix = format!("user {user} ");
    shipped()
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("users.acl has no user {user}"))
        .to_owned()
}

/// `user`'s shipped line under the name `name` (password `change-me-<name>`), with `change` appended (e.g.
/// `-watch`).
pub fn variant_of(user: &str, name: &str, change: &str) -> String {
    let line = shipped_user(user)
        .replacen(&format!("user {user} "), &format!("user {name} "), 1)
        .replacen(&format!(">change-me-{user} "), &format!(">change-me-{name} "), 1);
    format!("{line} {change}")
}

/// The shipped file in `dir`, `default` made an admin, and `extra` user lines appended.
pub fn acl_file(dir: &Path, extra: &[String]) -> PathBuf {
    let text = shipped();
    assert!(
        text.lines().any(|l| l.trim() == "user default off"),
        "the deployment disables the default user"
    );
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with("user default ") {
                "user default on nopass ~* &* +@all".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect();
    lines.extend(extra.iter().cloned());
    let path = dir.join("users.acl");
    std::fs::write(&path, lines.join("\n") + "\n").expect("write the test ACL file");
    path
}

/// The placeholder password of `user`.
pub fn password(user: &str) -> String {
    format!("change-me-{user}")
}

/// `redis://<user>:<password>@127.0.0.1:<port>`.
pub fn user_url(port: u16, user: &str) -> String {
    format!("redis://{user}:{}@127.0.0.1:{port}", password(user))
}

/// The `cluster:` target of every node of `cluster`, as `user`.
pub fn cluster_target(cluster: &RedisCluster, user: &str) -> String {
    let urls: Vec<String> = cluster.nodes().iter().map(|n| user_url(n.port(), user)).collect();
    format!("cluster:{}", urls.join(","))
}

/// A connection to `port` as `user`.
pub async fn connect_as(port: u16, user: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(user_url(port, user))
        .expect("URL")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot connect as {user}: {e}"))
}

/// What `redis` refused, from `ACL LOG`: `user: object (reason)` per entry. `CLIENT SETINFO`, which redis-rs
/// sends on connect to a Redis >= 7.2 and whose refusal it ignores, is left out (`deploy/redis/README.md`).
pub async fn acl_refusals(redis: &RedisServer) -> Vec<String> {
    let mut admin = redis.connection().await;
    let entries: Vec<Vec<redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut admin)
        .await
        .expect("ACL LOG");
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    entries
        .iter()
        .map(|entry| {
            let field = |name: &str| {
                entry
                    .chunks_exact(2)
                    .find(|p| text(&p[0]) == name)
                    .map(|p| text(&p[1]))
                    .unwrap_or_default()
            };
            (field("username"), field("object"), field("reason"))
        })
        .filter(|(_, object, _)| object != "client|setinfo")
        .map(|(user, object, reason)| format!("{user}: {object} ({reason})"))
        .collect()
}
