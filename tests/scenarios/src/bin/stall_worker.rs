//! A consumer process for the real-process tests (`tests/stalls.rs`, `tests/incarnations.rs`): one member of the
//! scenario group whose handler sleeps across the test's SIGSTOPs and records its start, completion or drop, with
//! the message's fencing token, into a file (see [`scenario_tests::stall_log`]).
//!
//! Arguments, `key=value`: `coordinators` (comma separated), `redis`, `stream`, `group`, `member`, `out` (the
//! record file), `handle_ms` (how long each handler sleeps), and the scenario timings in milliseconds:
//! `heartbeat_ms`, `ttl_ms`, `lease_ms`, `margin_ms`; optional: `read_failure_ms` (the consumer's
//! `read_failure_timeout`: how long its Redis may stay unreadable before it gives its shards back).
//!
//! Runs until killed, or until SIGTERM, which closes the consumer gracefully (drain, leave) and exits 0. Exits
//! with [`EXIT_REPLACED`] when the consumer stopped because another process took its member id over
//! (`ConsumerError::Replaced`), and 1 on any other error.

use scenario_tests::stall_log::{instant_as_wall_us, wall_us, Kind, Record};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use stream_consumer::{Consumer, ConsumerError, ConsumerStatus, Message};
use tokio::sync::watch;

/// Exit status when another process took the member id over (`MEMBER_REPLACED`).
const EXIT_REPLACED: i32 = 3;

/// Appends one line per call (one `write` of a whole line to a file opened for appending).
#[derive(Clone)]
struct Log {
    file: Arc<Mutex<File>>,
    status: Arc<OnceLock<watch::Receiver<ConsumerStatus>>>,
    member: String,
}

impl Log {
    /// The lease end the handler runs under (inside a poll of the handler), else the one the consumer's status
    /// shows.
    fn lease_end_us(&self) -> Option<u64> {
        let end = stream_consumer::lease_deadline().or_else(|| self.status.get()?.borrow().lease_expires_at)?;
        Some(instant_as_wall_us(end))
    }

    fn write(&self, kind: Kind, msg: &Message, start_us: u64) {
        let record = Record {
            kind,
            pid: std::process::id(),
            member: self.member.clone(),
            shard: msg.shard().0,
            entry: msg.id(),
            token: msg.fencing_token().0,
            start_us,
            at_us: wall_us(),
            lease_end_us: self.lease_end_us(),
        };
        let line = format!("{record}\n");
        let mut file = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = file.write_all(line.as_bytes()) {
            eprintln!("stall_worker: cannot write the record: {e}");
        }
    }
}

/// Records `D` when the handler's future is dropped before it recorded `E`.
struct DropRecorder<'a> {
    log: &'a Log,
    msg: &'a Message,
    start_us: u64,
    done: bool,
}

impl Drop for DropRecorder<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.log.write(Kind::Dropped, self.msg, self.start_us);
        }
    }
}

fn arg<'a>(args: &'a HashMap<String, String>, key: &str) -> &'a str {
    args.get(key)
        .map_or_else(|| panic!("stall_worker: missing argument {key}=..."), String::as_str)
}

fn ms(args: &HashMap<String, String>, key: &str) -> Duration {
    Duration::from_millis(
        arg(args, key)
            .parse()
            .unwrap_or_else(|_| panic!("stall_worker: {key} is not a number")),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: HashMap<String, String> = std::env::args()
        .skip(1)
        .filter_map(|a| a.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(arg(&args, "out"))
        .expect("stall_worker: cannot open the record file");
    let log = Log {
        file: Arc::new(Mutex::new(file)),
        status: Arc::new(OnceLock::new()),
        member: arg(&args, "member").to_owned(),
    };
    let handle_for = ms(&args, "handle_ms");
    let handler_log = log.clone();
    let mut builder = Consumer::builder(arg(&args, "stream"), arg(&args, "group"))
        .coordinators(arg(&args, "coordinators").split(','))
        .redis(arg(&args, "redis"))
        .member_id(arg(&args, "member"))
        .heartbeat_interval(ms(&args, "heartbeat_ms"))
        .member_ttl(ms(&args, "ttl_ms"))
        .assignment_lease(ms(&args, "lease_ms"))
        .lease_safety_margin(ms(&args, "margin_ms"))
        .request_timeout(Duration::from_millis(400))
        .read_block(Duration::from_millis(300))
        .batch_size(4);
    if args.contains_key("read_failure_ms") {
        builder = builder.read_failure_timeout(ms(&args, "read_failure_ms"));
    }
    let consumer = builder
        .handler(move |msg: Message| {
            let log = handler_log.clone();
            async move {
                let start_us = wall_us();
                log.write(Kind::Start, &msg, start_us);
                let mut dropped = DropRecorder {
                    log: &log,
                    msg: &msg,
                    start_us,
                    done: false,
                };
                // Real time: the handler's work, which a stop of the process interrupts.
                tokio::time::sleep(handle_for).await;
                // Recorded in the same poll that completes the handler.
                dropped.done = true;
                log.write(Kind::End, &msg, start_us);
                Ok::<(), std::io::Error>(())
            }
        })
        .build()
        .expect("stall_worker: invalid configuration");
    let _ = log.status.set(consumer.status());
    let shutdown = stream_consumer::CancellationToken::new();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("stall_worker: cannot watch SIGTERM");
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            terminate.recv().await;
            shutdown.cancel();
        }
    });
    match consumer.run(shutdown).await {
        Ok(_) => {}
        Err(e @ ConsumerError::Replaced { .. }) => {
            eprintln!("stall_worker: replaced: {e}");
            std::process::exit(EXIT_REPLACED);
        }
        Err(e) => {
            eprintln!("stall_worker: consumer stopped: {e}");
            std::process::exit(1);
        }
    }
}
