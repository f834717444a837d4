//! The raw baseline: the same records as pipelined `XADD`s, through redis-rs connections or hand-written RESP
//! on plain sockets.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use protocol::names::StreamName;
use protocol::routing::shard_for_key;
use protocol::{keys, ShardId};
use stream_producer::Record;

use crate::args::{Args, RawShape};

/// The inputs of a run, shared by every mode: keys, one payload and the shard stream names (the SDK has its own
/// from the routing). Records and commands are built from these inside the clock.
pub(crate) struct Workload {
    pub(crate) keys: Vec<String>,
    pub(crate) payload: Vec<u8>,
    pub(crate) shards: u32,
    pub(crate) shard_keys: Vec<String>,
}

/// The records still to send, claimed a slice at a time by the tasks of a run.
pub(crate) struct Claims {
    next: AtomicUsize,
    n: usize,
    batch: usize,
}

/// Runs `tasks` tasks made by `task` (given its number) to their end; the time they took together.
pub(crate) async fn timed_tasks<F, Fut>(tasks: usize, task: F) -> Result<Duration>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks).map(|t| tokio::spawn(task(t))).collect();
    for h in handles {
        h.await??;
    }
    Ok(start.elapsed())
}

impl Claims {
    pub(crate) fn new(n: usize, batch: usize) -> Arc<Self> {
        Arc::new(Claims {
            next: AtomicUsize::new(0),
            n,
            batch,
        })
    }

    /// The next slice of record indexes, `None` once every record was claimed.
    pub(crate) fn next(&self) -> Option<std::ops::Range<usize>> {
        let from = self.next.fetch_add(self.batch, Ordering::Relaxed);
        (from < self.n).then(|| from..(from + self.batch).min(self.n))
    }
}

impl Workload {
    /// `order` becomes the (shard, record) pairs of the records in `range`.
    pub(crate) fn route(&self, range: std::ops::Range<usize>, order: &mut Vec<(usize, usize)>) {
        order.clear();
        order.extend(range.map(|i| (shard_for_key(self.keys[i].as_bytes(), self.shards).index(), i)));
    }

    pub(crate) fn new(args: &Args, stream: &StreamName) -> Workload {
        Workload {
            keys: (0..args.records).map(|i| format!("key-{}", i % args.keys)).collect(),
            payload: vec![b'x'; args.payload_bytes],
            shards: args.shards,
            shard_keys: (0..args.shards)
                .map(|s| keys::shard_stream(stream, ShardId(s)))
                .collect(),
        }
    }

    pub(crate) fn record(&self, i: usize) -> Record {
        Record::with_key(self.keys[i].as_str()).field("p", self.payload.as_slice())
    }
}

/// Multiplexed connections with the SDK's default response deadline (5 s), so deep pipelines on a busy machine
/// do not time out where the SDK would not.
pub(crate) async fn raw_connections(url: &str, n: usize) -> Result<Vec<redis::aio::MultiplexedConnection>> {
    let client = redis::Client::open(url)?;
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(5)));
    let mut cons = Vec::with_capacity(n);
    for _ in 0..n {
        cons.push(client.get_multiplexed_async_connection_with_config(&config).await?);
    }
    Ok(cons)
}

/// The raw loop in one shape over the first `n` records: connections are opened before the clock starts;
/// shards, pipelines and commands are built inside it.
pub(crate) async fn raw_run(url: &str, shape: RawShape, n: usize, work: &Arc<Workload>) -> Result<Duration> {
    if shape.resp {
        return resp_run(url, shape, n, work).await;
    }
    let cons = raw_connections(url, shape.connections).await?;
    let claims = Claims::new(n, shape.depth);
    let depth = shape.depth;
    let start = Instant::now();
    let tasks: Vec<_> = (0..shape.tasks)
        .map(|t| {
            let mut con = cons[t % cons.len()].clone();
            let work = work.clone();
            let claims = claims.clone();
            tokio::spawn(async move {
                let mut order: Vec<(usize, usize)> = Vec::with_capacity(depth);
                loop {
                    let Some(range) = claims.next() else {
                        return Ok::<_, anyhow::Error>(());
                    };
                    let (from, to) = (range.start, range.end);
                    work.route(range, &mut order);
                    if shape.grouped {
                        order.sort_unstable();
                    }
                    let mut pipe = redis::pipe();
                    for &(shard, _) in &order {
                        pipe.cmd("XADD")
                            .arg(work.shard_keys[shard].as_str())
                            .arg("*")
                            .arg("p")
                            .arg(work.payload.as_slice());
                    }
                    let replies: Vec<redis::Value> = pipe.query_async(&mut con).await?;
                    ensure!(
                        replies.len() == to - from,
                        "{} replies to {} XADDs",
                        replies.len(),
                        to - from
                    );
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

/// The hand-written loop: one plain socket per task, pipelines encoded as RESP into one reused buffer (inside the
/// clock, like every other mode's commands), replies counted by [`skip_replies`].
pub(crate) async fn resp_run(url: &str, shape: RawShape, n: usize, work: &Arc<Workload>) -> Result<Duration> {
    use tokio::io::AsyncWriteExt;
    let addr = url.strip_prefix("redis://").context("a redis:// url")?;
    let mut sockets = Vec::with_capacity(shape.tasks);
    for _ in 0..shape.tasks {
        let socket = tokio::net::TcpStream::connect(addr).await?;
        socket.set_nodelay(true)?;
        sockets.push(socket);
    }
    let claims = Claims::new(n, shape.depth);
    let depth = shape.depth;
    let start = Instant::now();
    let tasks: Vec<_> = sockets
        .into_iter()
        .map(|mut socket| {
            let work = work.clone();
            let claims = claims.clone();
            tokio::spawn(async move {
                let mut order: Vec<(usize, usize)> = Vec::with_capacity(depth);
                let mut out: Vec<u8> = Vec::with_capacity(depth * (work.payload.len() + 96));
                let mut replies = ReplyBuffer::default();
                loop {
                    let Some(range) = claims.next() else {
                        return Ok::<_, anyhow::Error>(());
                    };
                    let (from, to) = (range.start, range.end);
                    work.route(range, &mut order);
                    order.sort_unstable();
                    out.clear();
                    for &(shard, _) in &order {
                        encode_xadd(&mut out, work.shard_keys[shard].as_bytes(), &work.payload);
                    }
                    socket.write_all(&out).await?;
                    skip_replies(&mut socket, &mut replies, to - from).await?;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

/// Appends `XADD <key> * p <payload>` in RESP.
pub(crate) fn encode_xadd(out: &mut Vec<u8>, key: &[u8], payload: &[u8]) {
    use std::io::Write;
    out.extend_from_slice(b"*5\r\n$4\r\nXADD\r\n");
    let _ = write!(out, "${}\r\n", key.len());
    out.extend_from_slice(key);
    out.extend_from_slice(b"\r\n$1\r\n*\r\n$1\r\np\r\n");
    let _ = write!(out, "${}\r\n", payload.len());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

/// Bytes read from a socket and not yet parsed.
#[derive(Default)]
pub(crate) struct ReplyBuffer {
    pub(crate) buf: Vec<u8>,
    pub(crate) start: usize,
    pub(crate) end: usize,
}

/// Reads and checks `n` replies of `XADD` (bulk strings; an error reply fails the run).
pub(crate) async fn skip_replies(socket: &mut tokio::net::TcpStream, r: &mut ReplyBuffer, mut n: usize) -> Result<()> {
    use tokio::io::AsyncReadExt;
    while n > 0 {
        if let Some(used) = one_reply(&r.buf[r.start..r.end])? {
            r.start += used;
            n -= 1;
            continue;
        }
        r.buf.copy_within(r.start..r.end, 0);
        r.end -= r.start;
        r.start = 0;
        if r.buf.len() < r.end + 16 * 1024 {
            r.buf.resize(r.end + 64 * 1024, 0);
        }
        let got = socket.read(&mut r.buf[r.end..]).await?;
        ensure!(got > 0, "redis closed the connection with {n} replies outstanding");
        r.end += got;
    }
    Ok(())
}

/// The length of the first complete reply in `b`, if there is one.
pub(crate) fn one_reply(b: &[u8]) -> Result<Option<usize>> {
    let Some(nl) = b.iter().position(|&c| c == b'\n') else {
        return Ok(None);
    };
    let line = &b[..nl.saturating_sub(1)];
    match line.first() {
        Some(b'$') => {
            let len: usize = std::str::from_utf8(&line[1..])?.parse()?;
            let total = nl + 1 + len + 2;
            Ok((b.len() >= total).then_some(total))
        }
        Some(b'+' | b':') => Ok(Some(nl + 1)),
        _ => bail!("unexpected reply to XADD: {}", String::from_utf8_lossy(line)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_print() {
        for text in ["50x50x32", "1x4x256g", "2x2x512r"] {
            assert_eq!(text.parse::<RawShape>().expect(text).to_string(), text);
        }
        assert!(
            "2x4x256r".parse::<RawShape>().is_err(),
            "RESP shapes have one task per socket"
        );
        assert!("0x4x256".parse::<RawShape>().is_err());
        assert!("4x256".parse::<RawShape>().is_err());
    }

    #[test]
    fn replies_are_counted_whole() {
        let mut out = Vec::new();
        encode_xadd(&mut out, b"k", b"vv");
        assert_eq!(
            out,
            b"*5\r\n$4\r\nXADD\r\n$1\r\nk\r\n$1\r\n*\r\n$1\r\np\r\n$2\r\nvv\r\n"
        );
        assert_eq!(one_reply(b"$15\r\n1700000000000-0\r\n$3").unwrap(), Some(22));
        assert_eq!(one_reply(b"$15\r\n1700000000000-").unwrap(), None);
        assert_eq!(one_reply(b"$15").unwrap(), None);
        assert!(one_reply(b"-ERR wrong\r\n").is_err());
    }
}
