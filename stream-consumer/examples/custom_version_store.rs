//! A user-implemented [`VersionStore`]: the highest observed metadata version kept in a hash on a *separate*,
//! durable Redis (for example a small managed instance with AOF `appendfsync always`), so a consumer restarted on
//! a new machine (no local disk to keep a file on) still tells the coordinator which version it saw last, and a
//! rollback of the main Redis is detected.
//!
//! ```text
//! VERSION_REDIS_URL=redis://durable:6379 REDIS_URL=redis://127.0.0.1:6379 \
//! COORDINATOR_URL=http://127.0.0.1:7400 \
//!     cargo run -p stream-consumer --example custom_version_store -- orders billing
//! ```
//!
//! The two rules of the SPI: `load` returns 0 when nothing is stored, and `store` is monotonic (a lower value
//! never replaces a higher one), done here atomically on the server by a tiny script.

use redis::aio::ConnectionManager;
use redis::Script;
use stream_consumer::{CancellationToken, Consumer, Message, VersionStore, VersionStoreError};

/// Keeps versions as fields of one Redis hash.
#[derive(Clone)]
struct RedisHashVersionStore {
    conn: ConnectionManager,
    hash: String,
    raise: Script,
}

impl RedisHashVersionStore {
    async fn connect(url: &str, hash: impl Into<String>) -> Result<Self, redis::RedisError> {
        let conn = ConnectionManager::new(redis::Client::open(url)?).await?;
        Ok(RedisHashVersionStore {
            conn,
            hash: hash.into(),
            // HSET only when higher: monotonic even with several processes writing the same key.
            raise: Script::new(
                r"local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
                  if tonumber(ARGV[2]) > cur then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
                  return 0",
            ),
        })
    }
}

fn io(e: redis::RedisError) -> VersionStoreError {
    VersionStoreError::other(e)
}

impl VersionStore for RedisHashVersionStore {
    async fn load(&self, key: &str) -> Result<u64, VersionStoreError> {
        let mut conn = self.conn.clone();
        let v: Option<String> = redis::cmd("HGET")
            .arg(&self.hash)
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(io)?;
        match v {
            None => Ok(0),
            Some(text) => text.parse().map_err(|_| VersionStoreError::Corrupt(text)),
        }
    }

    async fn store(&self, key: &str, version: u64) -> Result<(), VersionStoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = self
            .raise
            .key(&self.hash)
            .arg(key)
            .arg(version)
            .invoke_async(&mut conn)
            .await
            .map_err(io)?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (stream, group) = (
        args.next().unwrap_or_else(|| "orders".into()),
        args.next().unwrap_or_else(|| "billing".into()),
    );
    let env = |k: &str, default: &str| std::env::var(k).unwrap_or_else(|_| default.to_owned());
    let store =
        RedisHashVersionStore::connect(&env("VERSION_REDIS_URL", "redis://127.0.0.1:6380"), "consumer-versions")
            .await?;

    let consumer = Consumer::builder(stream, group)
        .coordinator(env("COORDINATOR_URL", "http://127.0.0.1:7400"))
        .redis(env("REDIS_URL", "redis://127.0.0.1:6379"))
        .version_store(store)
        .handler(|msg: Message| async move {
            println!("{} {}", msg.shard(), msg.id());
            Ok::<_, std::convert::Infallible>(())
        })
        .build()?;

    let shutdown = CancellationToken::new();
    let on_ctrl_c = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_ctrl_c.cancel();
    });
    let report = consumer.run(shutdown).await?;
    println!("stopped; left the group: {}", report.left);
    Ok(())
}
