//! A pipelining connection to one Redis server that takes requests already encoded as RESP.
//!
//! Like redis-rs's `MultiplexedConnection`, many tasks share it and their requests are answered in the order they
//! were handed over; unlike it, a request is a byte buffer the caller wrote with [`crate::resp`] (no `Cmd` per
//! command, no copy into a pipeline), and replies are read by [`crate::resp::parse`]. It also implements redis-rs's
//! [`ConnectionLike`], so `Cmd::query_async` and `Pipeline::query_async` work on it for everything off the hot
//! path.
//!
//! One task per connection writes and reads: requests queued while it writes go out together in one write, and
//! a caller never touches the socket, so dropping a caller's future (cancellation) cannot leave half a command on
//! the wire. Any transport or protocol failure ends the connection and fails every request waiting on it; a
//! request handed over after that fails at once. Nothing is retried here: the caller knows whether a request
//! that may have run can be sent again.
//!
//! Speaks RESP2 only (no `HELLO 3`), over TCP, TLS over TCP (`rediss://`, with the configuration of a
//! [`RedisTls`], the same as every redis-rs connection's) or a Unix socket.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use redis::aio::ConnectionLike;
use redis::{Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::resp;
use crate::tls_setup::{self, RedisTls};

/// Most bytes gathered from queued requests into one write.
const MAX_WRITE: usize = 1 << 20;
/// Read buffer size (grows when one reply is larger).
const READ_CHUNK: usize = 64 * 1024;

type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// A shared, pipelining connection to one Redis server (see the module docs). Cheap to clone; the connection
/// closes when the last clone is dropped.
#[derive(Clone)]
pub struct PipelinedConnection {
    requests: mpsc::UnboundedSender<Request>,
    db: i64,
    response_timeout: Option<Duration>,
}

impl std::fmt::Debug for PipelinedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelinedConnection")
            .field("db", &self.db)
            .field("closed", &self.requests.is_closed())
            .finish_non_exhaustive()
    }
}

/// One request: its bytes (in parts, written in order) and how many replies answer it.
struct Request {
    parts: Vec<Bytes>,
    replies: usize,
    answer: Answer,
}

/// A request written and waiting for its replies.
struct Waiting {
    replies: usize,
    answer: Answer,
}

/// Where a request's replies go, and in which form.
enum Answer {
    /// Parsed into [`Value`]s.
    Values(oneshot::Sender<RedisResult<Vec<Value>>>),
    /// Each reply's bytes, as the server sent them (for [`crate::resp::Cursor`]).
    Frames(oneshot::Sender<RedisResult<Vec<Vec<u8>>>>),
}

impl Answer {
    fn fail(self, e: RedisError) {
        // The caller may have given up (timeout, cancellation): nobody to tell then.
        let _ = match self {
            Answer::Values(tx) => tx.send(Err(e)).is_ok(),
            Answer::Frames(tx) => tx.send(Err(e)).is_ok(),
        };
    }

    fn collector(&self, replies: usize) -> Collected {
        let capacity = replies.min(4096);
        match self {
            Answer::Values(_) => Collected::Values(Vec::with_capacity(capacity)),
            Answer::Frames(_) => Collected::Frames(Vec::with_capacity(capacity)),
        }
    }

    fn send(self, collected: Collected) {
        let _ = match (self, collected) {
            (Answer::Values(tx), Collected::Values(v)) => tx.send(Ok(v)).is_ok(),
            (Answer::Frames(tx), Collected::Frames(f)) => tx.send(Ok(f)).is_ok(),
            (answer, _) => {
                answer.fail(io::Error::other("replies collected in the wrong form").into());
                false
            }
        };
    }
}

/// The replies of the request being answered, so far.
enum Collected {
    Values(Vec<Value>),
    Frames(Vec<Vec<u8>>),
}

impl Collected {
    fn len(&self) -> usize {
        match self {
            Collected::Values(v) => v.len(),
            Collected::Frames(f) => f.len(),
        }
    }
}

/// What ended a connection, shared by every request it fails.
#[derive(Debug, Clone)]
struct Closed {
    kind: io::ErrorKind,
    detail: String,
}

impl Closed {
    fn error(&self) -> RedisError {
        io::Error::new(self.kind, self.detail.clone()).into()
    }
}

impl PipelinedConnection {
    /// Opens a connection to the server `info` names and authenticates and selects its database as redis-rs
    /// would, all within `connect_timeout`. Every later request waits at most `response_timeout` for its replies.
    /// A TLS address (`rediss://`) is verified with `tls` (the system's roots alone when `None`).
    ///
    /// # Errors
    /// The server cannot be reached, fails the TLS handshake (the cause in words, see
    /// [`crate::TlsFailure`]), or refuses `AUTH` or `SELECT`.
    pub async fn connect(
        info: &ConnectionInfo,
        tls: Option<&RedisTls>,
        connect_timeout: Option<Duration>,
        response_timeout: Option<Duration>,
    ) -> RedisResult<Self> {
        let open = open(info, tls);
        let (reader, writer) = match connect_timeout {
            Some(limit) => tokio::time::timeout(limit, open)
                .await
                .map_err(|_| match info.addr() {
                    ConnectionAddr::TcpTls { host, port, .. } => RedisError::from((
                        ErrorKind::Io,
                        "TLS connection to Redis failed",
                        format!(
                            "{host}:{port}: {} (no TLS answer within {limit:?})",
                            crate::TlsFailure::NoAnswer
                        ),
                    )),
                    _ => RedisError::from(io::Error::from(io::ErrorKind::TimedOut)),
                })??,
            None => open.await?,
        };
        let (requests, queue) = mpsc::unbounded_channel();
        tokio::spawn(drive(reader, writer, queue));
        Ok(PipelinedConnection {
            requests,
            db: info.redis_settings().db(),
            response_timeout,
        })
    }

    /// Sends `bytes` (one or more complete commands) and returns the `replies` replies that answer them, error
    /// replies included as [`Value::ServerError`].
    ///
    /// # Errors
    /// A transport or protocol failure (the connection is closed from then on), or no answer within the response
    /// timeout: the commands may or may not have run.
    pub async fn send(&self, bytes: impl Into<Bytes>, replies: usize) -> RedisResult<Vec<Value>> {
        self.send_parts(vec![bytes.into()], replies).await
    }

    /// Like [`PipelinedConnection::send`], the commands given in parts (sent one after the other, with nothing
    /// between them): buffers encoded separately need not be copied into one.
    ///
    /// # Errors
    /// As [`PipelinedConnection::send`].
    pub async fn send_parts(&self, parts: Vec<Bytes>, replies: usize) -> RedisResult<Vec<Value>> {
        self.submit(parts, replies).await
    }

    /// Hands the commands to the connection now, in the order of the calls, and returns the future of their
    /// replies (see [`PipelinedConnection::send`]). For a caller that must have a request on the wire before it
    /// lets another caller send, without waiting for the answer: requests handed over later are written after
    /// this one, and answered after it.
    pub fn submit(
        &self,
        parts: Vec<Bytes>,
        replies: usize,
    ) -> impl std::future::Future<Output = RedisResult<Vec<Value>>> + Send + 'static {
        let (answer, rx) = oneshot::channel();
        self.hand_over(parts, replies, Answer::Values(answer), rx)
    }

    /// Like [`PipelinedConnection::submit`], each reply returned as the bytes the server sent (one complete RESP
    /// reply each, measured by [`crate::resp::frame_len`] within the same bounds as the parser), to be decoded
    /// with a [`crate::resp::Cursor`]. An error reply is a frame too (it starts with `-`; [`crate::resp::parse`]
    /// turns it into its [`Value::ServerError`]).
    ///
    /// # Errors
    /// As [`PipelinedConnection::send`].
    pub fn submit_frames(
        &self,
        parts: Vec<Bytes>,
        replies: usize,
    ) -> impl std::future::Future<Output = RedisResult<Vec<Vec<u8>>>> + Send + 'static {
        let (answer, rx) = oneshot::channel();
        self.hand_over(parts, replies, Answer::Frames(answer), rx)
    }

    fn hand_over<T: Send + 'static>(
        &self,
        parts: Vec<Bytes>,
        replies: usize,
        answer: Answer,
        rx: oneshot::Receiver<RedisResult<T>>,
    ) -> impl std::future::Future<Output = RedisResult<T>> + Send + 'static {
        let handed = self.requests.send(Request { parts, replies, answer }).is_ok();
        let limit = self.response_timeout;
        // Keeps the connection open until the answer is in, even if every handle is dropped meanwhile.
        let open = self.requests.clone();
        async move {
            let _open = open;
            if !handed {
                return Err(io::Error::new(io::ErrorKind::NotConnected, "the connection is closed").into());
            }
            let answered = match limit {
                Some(limit) => tokio::time::timeout(limit, rx)
                    .await
                    .map_err(|_| RedisError::from(io::Error::from(io::ErrorKind::TimedOut)))?,
                None => rx.await,
            };
            answered.unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the connection closed before answering",
                )
                .into())
            })
        }
    }

    /// Whether the connection has ended (a later request fails at once).
    pub fn is_closed(&self) -> bool {
        self.requests.is_closed()
    }
}

impl ConnectionLike for PipelinedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut replies = self.send(cmd.get_packed_command(), 1).await?;
            Ok(replies.pop().expect("one reply was awaited"))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut replies = self.send(pipeline.get_packed_pipeline(), offset + count).await?;
            Ok(replies.split_off(offset))
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

async fn open(info: &ConnectionInfo, tls: Option<&RedisTls>) -> RedisResult<(Reader, Writer)> {
    let (mut reader, mut writer): (Reader, Writer) = match info.addr() {
        ConnectionAddr::Tcp(host, port) => {
            let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            stream.set_nodelay(true)?;
            let (r, w) = stream.into_split();
            (Box::new(r), Box::new(w))
        }
        ConnectionAddr::TcpTls {
            host, port, insecure, ..
        } => {
            let tls = match tls {
                Some(tls) => tls.clone(),
                None => RedisTls::system_default().map_err(tls_setup::config_error)?,
            };
            // `#insecure` in the URL asks what the option asks.
            let tls = if *insecure && !tls.options().insecure_skip_verify {
                RedisTls::load(&tls.options().clone().insecure_skip_verify()).map_err(tls_setup::config_error)?
            } else {
                tls
            };
            let name = tls_setup::server_name(host)?;
            let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            stream.set_nodelay(true)?;
            let stream = tokio_rustls::TlsConnector::from(tls.client_config())
                .connect(name, stream)
                .await
                .map_err(|e| tls_error(host, *port, e))?;
            let (r, w) = tokio::io::split(stream);
            (Box::new(r), Box::new(w))
        }
        #[cfg(unix)]
        ConnectionAddr::Unix(path) => {
            let (r, w) = tokio::net::UnixStream::connect(path).await?.into_split();
            (Box::new(r), Box::new(w))
        }
        other => {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "a pipelined connection speaks plain TCP or a Unix socket",
                format!("{other}"),
            )))
        }
    };
    let settings = info.redis_settings();
    let mut hello = Vec::new();
    let mut replies = 0;
    if let Some(password) = settings.password() {
        match settings.username() {
            Some(user) => {
                resp::write_command(&mut hello, 3);
                resp::write_arg(&mut hello, b"AUTH");
                resp::write_arg(&mut hello, user.as_bytes());
            }
            None => {
                resp::write_command(&mut hello, 2);
                resp::write_arg(&mut hello, b"AUTH");
            }
        }
        resp::write_arg(&mut hello, password.as_bytes());
        replies += 1;
    }
    if settings.db() != 0 {
        resp::write_command(&mut hello, 2);
        resp::write_arg(&mut hello, b"SELECT");
        resp::write_int_arg(&mut hello, settings.db().unsigned_abs());
        replies += 1;
    }
    if replies > 0 {
        writer.write_all(&hello).await?;
        writer.flush().await?;
        let mut buf = Vec::with_capacity(256);
        for _ in 0..replies {
            let reply = loop {
                if let Some((value, used)) = resp::parse(&buf).map_err(protocol_error)? {
                    buf.drain(..used);
                    break value;
                }
                if reader.read_buf(&mut buf).await? == 0 {
                    return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
                }
            };
            // AUTH or SELECT refused: the connection is of no use.
            reply.extract_error()?;
        }
    }
    Ok((reader, writer))
}

fn protocol_error(e: resp::ProtocolError) -> RedisError {
    io::Error::new(io::ErrorKind::InvalidData, e).into()
}

/// The connection's task: writes what is queued, reads what answers it, until either side fails or every handle
/// is gone. Then every request still waiting is failed.
/// A TLS handshake that failed, with its cause in words.
fn tls_error(host: &str, port: u16, e: io::Error) -> RedisError {
    let cause = crate::TlsFailure::of(&e).map_or_else(String::new, |f| format!("{f}: "));
    RedisError::from((
        ErrorKind::Io,
        "TLS connection to Redis failed",
        format!("{host}:{port}: {cause}{e}"),
    ))
}

/// Writes `bytes` and flushes: a TLS stream keeps the last record in its buffer until flushed (a no-op on TCP).
async fn write_flushed(writer: &mut Writer, bytes: &[u8]) -> io::Result<()> {
    writer.write_all(bytes).await?;
    writer.flush().await
}

async fn drive(reader: Reader, writer: Writer, queue: mpsc::UnboundedReceiver<Request>) {
    let waiting: Arc<Mutex<VecDeque<Waiting>>> = Arc::default();
    let closed = tokio::select! {
        closed = write_loop(writer, queue, waiting.clone()) => closed,
        closed = read_loop(reader, waiting.clone()) => closed,
    };
    let waiting = std::mem::take(&mut *waiting.lock().expect("never held across a panic"));
    for w in waiting {
        w.answer.fail(closed.error());
    }
}

async fn write_loop(
    mut writer: Writer,
    mut queue: mpsc::UnboundedReceiver<Request>,
    waiting: Arc<Mutex<VecDeque<Waiting>>>,
) -> Closed {
    let mut gathered: Vec<u8> = Vec::new();
    let mut batch: Vec<Bytes> = Vec::new();
    loop {
        let Some(first) = queue.recv().await else {
            return Closed {
                kind: io::ErrorKind::NotConnected,
                detail: "the connection was dropped".into(),
            };
        };
        let mut size = 0;
        {
            let mut w = waiting.lock().expect("never held across a panic");
            let mut next = Some(first);
            // Whatever else is queued now goes in the same write.
            while let Some(request) = next {
                size += request.parts.iter().map(Bytes::len).sum::<usize>();
                batch.extend(request.parts);
                if request.replies == 0 {
                    let collected = request.answer.collector(0);
                    request.answer.send(collected);
                } else {
                    w.push_back(Waiting {
                        replies: request.replies,
                        answer: request.answer,
                    });
                }
                next = if size < MAX_WRITE { queue.try_recv().ok() } else { None };
            }
        }
        let written = if batch.len() == 1 {
            write_flushed(&mut writer, &batch[0]).await
        } else {
            gathered.clear();
            gathered.reserve(size);
            for b in &batch {
                gathered.extend_from_slice(b);
            }
            write_flushed(&mut writer, &gathered).await
        };
        batch.clear();
        if let Err(e) = written {
            return Closed {
                kind: e.kind(),
                detail: format!("writing to Redis failed: {e}"),
            };
        }
        if gathered.capacity() > 4 * MAX_WRITE {
            gathered = Vec::new();
        }
    }
}

/// Reads the reply at the start of `rest` into `collected`: how many bytes it took, or `None` while it is not all
/// here. A reply found incomplete is measured from then on by a [`resp::FrameScanner`] kept in `incomplete`,
/// which resumes where it stopped as more bytes arrive, and is parsed (or copied) once, when complete: a large
/// reply that arrives in many reads costs linear work, not a parse from its start after every read.
fn read_reply(
    rest: &[u8],
    collected: &mut Collected,
    incomplete: &mut Option<resp::FrameScanner>,
) -> Result<Option<usize>, resp::ProtocolError> {
    if let Some(scanner) = incomplete.as_mut() {
        if scanner.scan(rest)?.is_none() {
            return Ok(None);
        }
        *incomplete = None;
    }
    match collected {
        Collected::Values(values) => match resp::parse(rest)? {
            Some((value, used)) => {
                values.push(value);
                Ok(Some(used))
            }
            None => {
                let mut scanner = resp::FrameScanner::default();
                if scanner.scan(rest)?.is_some() {
                    return Err(resp::ProtocolError(
                        "the parser and the scanner disagree on a reply".into(),
                    ));
                }
                *incomplete = Some(scanner);
                Ok(None)
            }
        },
        Collected::Frames(frames) => {
            let mut scanner = resp::FrameScanner::default();
            match scanner.scan(rest)? {
                Some(used) => {
                    frames.push(rest[..used].to_vec());
                    Ok(Some(used))
                }
                None => {
                    *incomplete = Some(scanner);
                    Ok(None)
                }
            }
        }
    }
}

async fn read_loop(mut reader: Reader, waiting: Arc<Mutex<VecDeque<Waiting>>>) -> Closed {
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut start = 0;
    // The request being answered, taken off the queue while its replies arrive.
    let mut current: Option<(Waiting, Collected)> = None;
    // The scan of a reply that is not all here yet (it starts at `start`).
    let mut incomplete: Option<resp::FrameScanner> = None;
    loop {
        while start < buf.len() {
            let (request, collected) = match current.as_mut() {
                Some(c) => c,
                None => {
                    let Some(next) = waiting.lock().expect("never held across a panic").pop_front() else {
                        return Closed {
                            kind: io::ErrorKind::InvalidData,
                            detail: "Redis sent a reply nobody asked for".into(),
                        };
                    };
                    let collected = next.answer.collector(next.replies);
                    current.insert((next, collected))
                }
            };
            let rest = &buf[start..];
            let used = match read_reply(rest, collected, &mut incomplete) {
                Ok(Some(used)) => used,
                Ok(None) => break,
                Err(e) => {
                    return Closed {
                        kind: io::ErrorKind::InvalidData,
                        detail: e.to_string(),
                    }
                }
            };
            start += used;
            if collected.len() == request.replies {
                let (request, collected) = current.take().expect("set above");
                request.answer.send(collected);
            }
        }
        if start == buf.len() {
            buf.clear();
            start = 0;
        } else if start > buf.len() / 2 {
            buf.drain(..start);
            start = 0;
        }
        if buf.capacity() - buf.len() < READ_CHUNK / 4 {
            buf.reserve(READ_CHUNK);
        }
        match reader.read_buf(&mut buf).await {
            Ok(0) => {
                return Closed {
                    kind: io::ErrorKind::UnexpectedEof,
                    detail: "Redis closed the connection".into(),
                }
            }
            Ok(_) => {}
            Err(e) => {
                return Closed {
                    kind: e.kind(),
                    detail: format!("reading from Redis failed: {e}"),
                }
            }
        }
    }
}
