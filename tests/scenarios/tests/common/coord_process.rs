//! Coordinators as processes of their own ([`CoordProcess`]), for tests that stop one with SIGSTOP or end it with
//! SIGTERM while it is in the middle of a request, and the hold that puts it there.
//!
//! # A process that holds a section
//! A coordinator process can be told (one line on its stdin) to hold the next critical section whose decision
//! records a given event for a given member (`MemberLeft`, `MemberJoined`): at the write boundary
//! ([`coord_server::fault`], [`Point::BeforeWrite`]) the section sleeps for the given time, with the group mutex
//! taken and the decision made, then goes on to its compare-and-set. It says so on its stdout when the hold
//! begins, so the test can stop or terminate it right then. A hold fires once: a section that loses its
//! compare-and-set meanwhile decides again on what it then loads and is not held again.
//!
//! # Why the test binary runs itself
//! The hold needs the coordinator library built with the `fault-injection` feature, which only the scenario
//! crate's dev-dependency enables (`tests/scenarios/Cargo.toml`): cargo keeps a dev-dependency's features out of
//! ordinary builds. A `src/bin` target cannot use dev-dependencies, and a normal dependency of the scenario crate
//! on `coord-server` with the feature would be unified into every plain workspace build (`cargo build --release`
//! at the root builds every member, so the shipped `coord-server` binary would carry the hooks). So the process is
//! the test binary itself, started again with [`SPEC_ENV`] set and told to run only its ignored test
//! [`CHILD_TEST`], which calls [`child_main`]. Any test file that starts coordinator processes declares that test
//! (`tests/incarnations.rs` does); run without [`SPEC_ENV`], it returns at once.
//!
//! # Lines on stdout
//! Each opens with `@@ ` (libtest writes there too). `coord listening <addr>` once bound; `coord armed <event> <member>` after each hold request;
//! `coord holding <event> <member> <ms>` when a hold begins; `coord stopped` after a graceful shutdown (SIGTERM:
//! new mutations get `503 COORDINATOR_TERMINATING`, entered sections finish, then the process exits 0).

use super::*;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};

/// The environment variable that makes [`child_main`] run a coordinator (its [`CoordSpec`], encoded).
pub const SPEC_ENV: &str = "SCENARIO_COORD_PROCESS";
/// The name of the ignored test that calls [`child_main`] in a test file that starts coordinator processes.
pub const CHILD_TEST: &str = "coord_process";

/// What a coordinator process runs with: the scenario coordinator configuration ([`coord_config`]) on a free port
/// of `127.0.0.1`, with an optional request timeout.
#[derive(Debug, Clone)]
pub struct CoordSpec {
    pub redis_url: String,
    /// The HTTP request deadline (the configuration's default when `None`).
    pub request_timeout: Option<Duration>,
}

impl CoordSpec {
    pub fn new(redis_url: impl Into<String>) -> CoordSpec {
        CoordSpec {
            redis_url: redis_url.into(),
            request_timeout: None,
        }
    }

    fn encode(&self) -> String {
        let mut s = format!("redis={}", self.redis_url);
        if let Some(t) = self.request_timeout {
            s.push_str(&format!(" request_timeout_ms={}", t.as_millis()));
        }
        s
    }

    fn decode(s: &str) -> CoordSpec {
        let mut spec = CoordSpec::new("");
        for (k, v) in s.split(' ').filter_map(|kv| kv.split_once('=')) {
            match k {
                "redis" => spec.redis_url = v.to_owned(),
                "request_timeout_ms" => {
                    spec.request_timeout = Some(Duration::from_millis(v.parse().expect("request_timeout_ms")))
                }
                other => panic!("coordinator process: unknown setting {other}"),
            }
        }
        spec
    }
}

/// The event whose section a coordinator process holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldOn {
    /// A section that records `MemberLeft` (a leave that removes the member).
    Left,
    /// A section that records `MemberJoined` (a join that creates an incarnation).
    Joined,
}

impl HoldOn {
    fn name(self) -> &'static str {
        match self {
            HoldOn::Left => "left",
            HoldOn::Joined => "joined",
        }
    }

    fn parse(s: &str) -> Option<HoldOn> {
        match s {
            "left" => Some(HoldOn::Left),
            "joined" => Some(HoldOn::Joined),
            _ => None,
        }
    }

    fn matches(self, member: &str, t: &Transition) -> bool {
        t.events.iter().any(|e| match (self, e) {
            (HoldOn::Left, Event::MemberLeft(m)) | (HoldOn::Joined, Event::MemberJoined(m)) => m.as_str() == member,
            _ => false,
        })
    }
}

/// A coordinator running in a process of its own (see the module docs). Killed (SIGKILL) when dropped.
pub struct CoordProcess {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    addr: SocketAddr,
    /// Every line of its stdout so far, appended by a reader thread.
    lines: Arc<Mutex<Vec<String>>>,
    stderr: PathBuf,
    exit: Option<ExitStatus>,
}

impl CoordProcess {
    /// Starts a coordinator process named `name` (its stderr goes to `<dir>/<name>.stderr`) and waits until it
    /// listens.
    ///
    /// # Panics
    /// When it does not listen within [`DEADLINE`].
    pub async fn start(spec: &CoordSpec, dir: &Path, name: &str) -> CoordProcess {
        let stderr = dir.join(format!("{name}.stderr"));
        let mut child = Command::new(std::env::current_exe().expect("the test binary's path"))
            .args([CHILD_TEST, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(SPEC_ENV, spec.encode())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("coordinator stderr file"))
            .spawn()
            .expect("start a coordinator process");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        {
            let lines = Arc::clone(&lines);
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    // libtest's own `test coord_process ... ` may open the line.
                    if let Some(at) = line.find(MARK) {
                        lines.lock().unwrap().push(line[at + MARK.len()..].to_owned());
                    }
                }
            });
        }
        let mut p = CoordProcess {
            name: name.to_owned(),
            stdin: child.stdin.take(),
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            lines,
            stderr,
            exit: None,
        };
        let line = p.wait_line("coord listening ").await;
        p.addr = line["coord listening ".len()..].parse().expect("a listen address");
        p
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its stderr so far (the coordinator's warnings), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The first stdout line starting with `prefix`, waiting up to [`DEADLINE`].
    ///
    /// # Panics
    /// When none comes in time, or the process exits first.
    pub async fn wait_line(&mut self, prefix: &str) -> String {
        let said = test_support::poll_every(Duration::from_millis(5), DEADLINE, || {
            let line = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.starts_with(prefix))
                .cloned();
            if line.is_none() {
                if let Some(status) = self.try_exit() {
                    panic!(
                        "{} exited ({status}) before saying `{prefix}`; log:\n{}",
                        self.name,
                        self.log()
                    );
                }
            }
            std::future::ready(line)
        })
        .await;
        said.unwrap_or_else(|| {
            panic!(
                "{} did not say `{prefix}` within {DEADLINE:?}; log:\n{}",
                self.name,
                self.log()
            )
        })
    }

    /// Whether a line starting with `prefix` came.
    pub fn said(&self, prefix: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l.starts_with(prefix))
    }

    /// Holds the next section that records `event` for `member`, for `delay` (see the module docs); returns once
    /// the process has taken the order.
    pub async fn hold(&mut self, event: HoldOn, member: &str, delay: Duration) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "hold {} {member} {}", event.name(), delay.as_millis()).expect("write to the coordinator");
        stdin.flush().expect("flush to the coordinator");
        self.wait_line(&format!("coord armed {} {member}", event.name())).await;
    }

    /// Waits until the hold of `event` for `member` began.
    pub async fn holding(&mut self, event: HoldOn, member: &str) {
        self.wait_line(&format!("coord holding {} {member} ", event.name()))
            .await;
    }

    /// SIGSTOP.
    pub fn stop(&self) {
        signal(self.pid(), "STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
    }

    /// SIGTERM: a graceful shutdown.
    pub fn terminate(&self) {
        signal(self.pid(), "TERM");
    }

    /// Its exit status, if it has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().expect("wait on the coordinator process");
        }
        self.exit
    }

    /// Waits until it exits.
    ///
    /// # Panics
    /// When it is still running after `timeout`.
    pub async fn exited(&mut self, timeout: Duration) -> ExitStatus {
        let exited = test_support::poll_for(timeout, || std::future::ready(self.try_exit())).await;
        exited.unwrap_or_else(|| panic!("{} still running after {timeout:?}; log:\n{}", self.name, self.log()))
    }
}

impl Drop for CoordProcess {
    fn drop(&mut self) {
        if self.exit.is_none() {
            // SIGKILL also ends a stopped process.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What opens each line of a coordinator process for the test (the rest of its stdout is libtest's).
const MARK: &str = "@@ ";

/// One line on stdout, flushed at once (the test waits for it).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{MARK}{line}");
    let _ = out.flush();
}

/// A hold order: the next section recording `on` for `member` sleeps `delay` at its write boundary.
struct Hold {
    on: HoldOn,
    member: String,
    delay: Duration,
}

/// The body of a coordinator process ([`CHILD_TEST`] calls it): runs the coordinator [`SPEC_ENV`] describes
/// until SIGTERM (graceful shutdown, then exit 0) or until its stdin closes (the test is gone: exit at once).
/// Returns at once when [`SPEC_ENV`] is not set.
pub fn child_main() {
    let Ok(spec) = std::env::var(SPEC_ENV) else {
        return;
    };
    let spec = CoordSpec::decode(&spec);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run_child(spec));
    std::process::exit(0);
}

async fn run_child(spec: CoordSpec) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).expect("watch SIGTERM");
    let mut config = coord_config(&spec.redis_url, SocketAddr::from(([127, 0, 0, 1], 0)));
    if let Some(t) = spec.request_timeout {
        config.request_timeout = t;
    }
    let handle = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    let holds: Arc<Mutex<Vec<Hold>>> = Arc::default();
    let _guard = {
        let holds = Arc::clone(&holds);
        fault::install(handle.coordinator(), move |site: &Site<'_>| {
            if site.point != Point::BeforeWrite {
                return Action::Continue;
            }
            let mut holds = holds.lock().unwrap();
            let Some(i) = holds.iter().position(|h| h.on.matches(&h.member, site.transition)) else {
                return Action::Continue;
            };
            let hold = holds.remove(i);
            say(&format!(
                "coord holding {} {} {}",
                hold.on.name(),
                hold.member,
                hold.delay.as_millis()
            ));
            Action::Delay(hold.delay)
        })
    };
    // Orders on stdin; its end means the test is gone.
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["hold", on, member, ms] => {
                    let on = HoldOn::parse(on).expect("hold left|joined");
                    let delay = Duration::from_millis(ms.parse().expect("hold delay in ms"));
                    holds.lock().unwrap().push(Hold {
                        on,
                        member: (*member).to_owned(),
                        delay,
                    });
                    say(&format!("coord armed {} {member}", on.name()));
                }
                _ => panic!("coordinator process: unknown order {line}"),
            }
        }
        std::process::exit(0);
    });
    say(&format!("coord listening {}", handle.addr()));
    terminate.recv().await;
    handle.shutdown().await;
    say("coord stopped");
}
