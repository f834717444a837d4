//! The raw baseline: the shard streams pre-loaded, then read with `XREADGROUP` and acknowledged with pipelined
//! `XACK`s, one task per shard.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Result};
use protocol::keys;
use protocol::names::StreamName;
use protocol::ShardId;
use redis::aio::ConnectionLike;
use redis::Value;
use redis_link::Connection;

use crate::args::RawLink;
use crate::args::SHARDS;
use crate::backend::{Backend, Cost, Nodes};
use crate::summary::RunResult;

pub(crate) fn shard_key(stream: &StreamName, shard: u32) -> String {
    keys::shard_stream(stream, ShardId(shard))
}

/// Appends `records` entries round-robin over the shards: one task per shard, pipelines of 256 (one shard per
/// pipeline, so it also runs on a cluster).
pub(crate) async fn preload(backend: &Backend, stream: &StreamName, records: usize, payload: &[u8]) -> Result<()> {
    let payload: Arc<Vec<u8>> = Arc::new(payload.to_vec());
    let mut tasks = Vec::new();
    for shard in 0..SHARDS {
        let mut con = backend.connection().await?;
        let key = shard_key(stream, shard);
        let payload = payload.clone();
        let mine = (records + (SHARDS - 1 - shard) as usize) / SHARDS as usize;
        tasks.push(tokio::spawn(async move {
            let mut left = mine;
            while left > 0 {
                let n = left.min(256);
                let mut pipe = redis::pipe();
                for _ in 0..n {
                    pipe.cmd("XADD")
                        .arg(&key)
                        .arg("*")
                        .arg("p")
                        .arg(payload.as_slice())
                        .ignore();
                }
                let () = pipe.query_async(&mut con).await?;
                left -= n;
            }
            Ok::<_, redis::RedisError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

pub(crate) async fn total_len(con: &mut Connection, stream: &StreamName) -> Result<u64> {
    let mut total = 0;
    for s in 0..SHARDS {
        let len: u64 = redis::cmd("XLEN").arg(shard_key(stream, s)).query_async(con).await?;
        total += len;
    }
    Ok(total)
}

/// Entries pending in `group` over every shard (`XPENDING` summaries).
pub(crate) async fn pending_total(con: &mut Connection, stream: &StreamName, group: &str) -> Result<u64> {
    let reads = (0..SHARDS).map(|s| {
        let mut con = con.clone();
        let key = shard_key(stream, s);
        async move {
            redis::cmd("XPENDING")
                .arg(key)
                .arg(group)
                .query_async::<Value>(&mut con)
                .await
        }
    });
    let replies: Vec<Value> = futures::future::try_join_all(reads).await?;
    let mut total = 0;
    for r in replies {
        if let Value::Array(items) = r {
            if let Some(Value::Int(n)) = items.first() {
                total += u64::try_from(*n).unwrap_or(0);
            }
        }
    }
    Ok(total)
}

/// Creates the Redis consumer group `group` on every shard at `at` (`0` or `$`).
pub(crate) async fn create_redis_groups(
    con: &mut Connection,
    stream: &StreamName,
    group: &str,
    at: &str,
) -> Result<()> {
    for s in 0..SHARDS {
        let () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(shard_key(stream, s))
            .arg(group)
            .arg(at)
            .query_async(con)
            .await?;
    }
    Ok(())
}

/// Walks one `XREADGROUP` reply: pushes the entry ids to `ids`, returns the entries and the field bytes seen.
pub(crate) fn walk_read_reply(reply: &Value, ids: &mut Vec<Vec<u8>>) -> Result<(u64, u64)> {
    let streams = match reply {
        Value::Nil => return Ok((0, 0)),
        Value::Array(streams) => streams,
        other => bail!("unexpected XREADGROUP reply {other:?}"),
    };
    let (mut entries, mut bytes) = (0u64, 0u64);
    for stream in streams {
        let Value::Array(pair) = stream else {
            bail!("unexpected stream item {stream:?}");
        };
        let Some(Value::Array(list)) = pair.get(1) else {
            bail!("unexpected stream item {pair:?}");
        };
        for entry in list {
            let Value::Array(parts) = entry else {
                bail!("unexpected entry {entry:?}");
            };
            let (Some(Value::BulkString(id)), Some(Value::Array(fields))) = (parts.first(), parts.get(1)) else {
                bail!("unexpected entry {parts:?}");
            };
            ids.push(id.clone());
            for f in fields {
                if let Value::BulkString(b) = f {
                    bytes += b.len() as u64;
                }
            }
            entries += 1;
        }
    }
    Ok((entries, bytes))
}

/// One shard of the raw loop: pipelined `XACK` of the previous batch + `XREADGROUP` of the next, until empty.
pub(crate) async fn raw_shard(mut con: impl ConnectionLike, key: String, group: String, count: usize) -> Result<u64> {
    let mut ids: Vec<Vec<u8>> = Vec::with_capacity(count);
    let mut read = 0u64;
    let mut field_bytes = 0u64;
    loop {
        let mut pipe = redis::pipe();
        if !ids.is_empty() {
            pipe.cmd("XACK").arg(&key).arg(&group).arg(&ids).ignore();
        }
        pipe.cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&group)
            .arg("raw")
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(&key)
            .arg(">");
        let (reply,): (Value,) = pipe.query_async(&mut con).await?;
        ids.clear();
        let (n, b) = walk_read_reply(&reply, &mut ids)?;
        read += n;
        field_bytes += b;
        if n == 0 {
            ensure!(field_bytes > 0 || read == 0, "fields were read");
            return Ok(read);
        }
    }
}

pub(crate) async fn raw_run(
    backend: &Backend,
    con: &mut Connection,
    nodes: &mut Nodes,
    stream: &StreamName,
    group: &str,
    count: usize,
    link: RawLink,
) -> Result<RunResult> {
    create_redis_groups(con, stream, group, "0").await?;
    // One server: a connection of the chosen kind per shard task (no manager in the way); a cluster: a cluster
    // connection per task.
    let mut single = Vec::new();
    let mut pipelined = Vec::new();
    let mut cluster = Vec::new();
    for _ in 0..SHARDS {
        match (backend, link) {
            (Backend::Single(r), RawLink::Multiplexed) => {
                single.push(redis::Client::open(r.url())?.get_multiplexed_async_connection().await?)
            }
            (Backend::Single(r), RawLink::Pipelined) => {
                let info = redis::IntoConnectionInfo::into_connection_info(r.url())?;
                pipelined.push(redis_link::PipelinedConnection::connect(&info, None, None, None).await?)
            }
            (Backend::Cluster(_), _) => cluster.push(backend.connection().await?),
        }
    }
    let before = Cost::now(nodes).await?;
    let start = Instant::now();
    let key = |s: usize| shard_key(stream, s as u32);
    let tasks: Vec<_> = single
        .into_iter()
        .enumerate()
        .map(|(s, con)| tokio::spawn(raw_shard(con, key(s), group.to_owned(), count)))
        .chain(
            pipelined
                .into_iter()
                .enumerate()
                .map(|(s, con)| tokio::spawn(raw_shard(con, key(s), group.to_owned(), count))),
        )
        .chain(
            cluster
                .into_iter()
                .enumerate()
                .map(|(s, con)| tokio::spawn(raw_shard(con, key(s), group.to_owned(), count))),
        )
        .collect();
    let mut read = 0;
    for t in tasks {
        read += t.await??;
    }
    let took = start.elapsed();
    let cost = Cost::now(nodes).await?.since(before);
    let pending = pending_total(con, stream, group).await?;
    ensure!(pending == 0, "raw: {pending} entries left pending");
    Ok(RunResult {
        records: read,
        took,
        cost,
        rss_before_mib: 0.0,
        peak_rss_mib: None,
    })
}
