//! A TCP forwarder in front of Redis that counts the commands its clients send, by name, and the bytes.
//!
//! Redis's own counters cannot tell a command a client sent from one a script ran: in Redis 7.0 both
//! `total_commands_processed` and `INFO commandstats` count the `redis.call`s of a script as commands. Put between
//! the coordinator and Redis, this counts what the coordinator sends (an `EVALSHA` is one command, whatever the
//! script runs). It parses requests only (RESP arrays of bulk strings, what redis-rs sends) and forwards every
//! byte as it comes, both ways.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Commands by upper-case name, and request bytes, since the counter started.
#[derive(Debug, Clone, Default)]
pub struct Sent {
    /// Commands by name.
    pub commands: BTreeMap<String, u64>,
    /// Request bytes.
    pub bytes: u64,
}

impl Sent {
    /// Every command.
    pub fn total(&self) -> u64 {
        self.commands.values().sum()
    }

    /// `self - before`.
    pub fn since(&self, before: &Sent) -> Sent {
        Sent {
            commands: self
                .commands
                .iter()
                .filter_map(|(n, &c)| {
                    let d = c - before.commands.get(n).copied().unwrap_or(0);
                    (d > 0).then(|| (n.clone(), d))
                })
                .collect(),
            bytes: self.bytes - before.bytes,
        }
    }

    /// `NAME=count`, most sent first.
    pub fn breakdown(&self) -> String {
        let mut v: Vec<_> = self.commands.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1));
        v.iter().map(|(n, c)| format!("{n}={c}")).collect::<Vec<_>>().join(" ")
    }
}

/// The running forwarder; stops accepting when dropped (open connections end with their peers).
pub struct CountingProxy {
    addr: SocketAddr,
    sent: Arc<Mutex<Sent>>,
    accept: JoinHandle<()>,
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl CountingProxy {
    /// Starts forwarding a free loopback port to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<CountingProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let sent = Arc::new(Mutex::new(Sent::default()));
        let counts = sent.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counts = counts.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(target).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        forward(client, server, counts).await;
                    }
                });
            }
        });
        Ok(CountingProxy { addr, sent, accept })
    }

    /// `redis://` URL of the forwarder.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// The counts so far.
    pub fn sent(&self) -> Sent {
        self.sent.lock().expect("counts lock").clone()
    }
}

async fn forward(client: TcpStream, server: TcpStream, counts: Arc<Mutex<Sent>>) {
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut pending = Vec::new();
        loop {
            let n = match client_rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if server_wr.write_all(&buf[..n]).await.is_err() {
                break;
            }
            pending.extend_from_slice(&buf[..n]);
            let (names, used) = parse_requests(&pending);
            pending.drain(..used);
            let mut c = counts.lock().expect("counts lock");
            c.bytes += n as u64;
            for name in names {
                *c.commands.entry(name).or_default() += 1;
            }
        }
        let _ = server_wr.shutdown().await;
    };
    let down = async move {
        let _ = tokio::io::copy(&mut server_rd, &mut client_wr).await;
        let _ = client_wr.shutdown().await;
    };
    tokio::join!(up, down);
}

/// The names of the complete requests at the start of `buf`, and how many bytes they take.
fn parse_requests(buf: &[u8]) -> (Vec<String>, usize) {
    let mut names = Vec::new();
    let mut at = 0;
    while let Some((name, next)) = parse_one(buf, at) {
        names.push(name);
        at = next;
    }
    (names, at)
}

/// One request (`*N\r\n` then N `$L\r\n<L bytes>\r\n`) from `at`: its upper-case name and where the next starts.
fn parse_one(buf: &[u8], at: usize) -> Option<(String, usize)> {
    let (n, mut at) = line_number(buf, at, b'*')?;
    let mut name = String::new();
    for i in 0..n {
        let (len, start) = line_number(buf, at, b'$')?;
        let end = start + len;
        if buf.len() < end + 2 {
            return None;
        }
        if i == 0 {
            name = String::from_utf8_lossy(&buf[start..end]).to_ascii_uppercase();
        }
        at = end + 2;
    }
    Some((name, at))
}

/// `<prefix><digits>\r\n` at `at`: the number and where the line ends.
fn line_number(buf: &[u8], at: usize, prefix: u8) -> Option<(usize, usize)> {
    if *buf.get(at)? != prefix {
        return None;
    }
    let rest = &buf[at + 1..];
    let nl = rest.windows(2).position(|w| w == b"\r\n")?;
    let n = std::str::from_utf8(&rest[..nl]).ok()?.parse().ok()?;
    Some((n, at + 1 + nl + 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_complete_requests_and_keeps_a_partial_one() {
        let one = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
        let two = b"*3\r\n$7\r\nevalsha\r\n$2\r\nab\r\n$1\r\n0\r\n";
        let mut buf = Vec::new();
        buf.extend_from_slice(one);
        buf.extend_from_slice(two);
        buf.extend_from_slice(&one[..7]);
        let (names, used) = parse_requests(&buf);
        assert_eq!(names, vec!["GET".to_owned(), "EVALSHA".to_owned()]);
        assert_eq!(used, one.len() + two.len());
        let (names, used) = parse_requests(&buf[used..]);
        assert!(names.is_empty());
        assert_eq!(used, 0);
    }
}
