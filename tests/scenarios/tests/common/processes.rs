//! Worker and coordinator processes: signals, and the records the worker processes (`src/bin/stall_worker.rs`)
//! write ([`scenario_tests::stall_log`]).

use super::*;
use scenario_tests::stall_log::{wall_us, Record};
use std::path::{Path, PathBuf};

/// Sends `kill -<sig>` to `pid` (`STOP`, `CONT`, `TERM`, ...).
///
/// # Panics
/// When `kill` fails.
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -{sig} {pid} failed");
}

/// A fresh directory for the processes' records and logs, named after the test.
pub fn records_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{test}-{}-{}", std::process::id(), wall_us()));
    std::fs::create_dir_all(&dir).expect("record dir");
    dir
}

/// Every record of every `*.log` file in `dir` so far (a line cut by a kill is skipped).
pub fn read_records(dir: &Path) -> Vec<Record> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).expect("record dir") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            all.extend(text.lines().filter_map(Record::parse));
        }
    }
    all
}

/// A worker process (`src/bin/stall_worker.rs`), killed (SIGKILL) when dropped.
pub struct WorkerProcess {
    /// Its member id.
    pub member: String,
    /// Its record file is `<dir>/<name>.log`, its stderr `<dir>/<name>.stderr`.
    pub name: String,
    dir: PathBuf,
    child: std::process::Child,
    exit: Option<std::process::ExitStatus>,
}

impl WorkerProcess {
    /// Starts member `member` of `worker`'s group, recording into `<dir>/<name>.log`.
    pub fn start(worker: &StallWorker, member: &str, dir: &Path, name: &str) -> WorkerProcess {
        WorkerProcess {
            member: member.to_owned(),
            name: name.to_owned(),
            dir: dir.to_owned(),
            child: worker.spawn(member, dir, name),
            exit: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The name its handlings carry in a history: member id and process.
    pub fn who(&self) -> String {
        format!("{}#{}", self.member, self.pid())
    }

    /// SIGSTOP.
    pub fn stop(&self) {
        signal(self.pid(), "STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
    }

    /// SIGTERM: the consumer closes (drain, leave) and the process exits 0.
    pub fn terminate(&self) {
        signal(self.pid(), "TERM");
    }

    /// Its exit status, if it has exited.
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().expect("wait on the worker process");
        }
        self.exit
    }

    /// Waits up to `timeout` for it to exit.
    pub async fn exit_within(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        test_support::poll_for(timeout, || std::future::ready(self.try_exit())).await
    }

    /// Closes it gracefully (SIGTERM), killing it if it has not exited within [`DEADLINE`].
    pub async fn close(&mut self) {
        if self.try_exit().is_some() {
            return;
        }
        self.terminate();
        if self.exit_within(DEADLINE).await.is_none() {
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
        }
    }

    /// Handlers it started at or after `since_us` (wall µs), as recorded so far.
    pub fn starts_since(&self, since_us: u64) -> usize {
        let text = std::fs::read_to_string(self.dir.join(format!("{}.log", self.name))).unwrap_or_default();
        text.lines()
            .filter_map(Record::parse)
            .filter(|r| r.kind == scenario_tests::stall_log::Kind::Start && r.start_us >= since_us)
            .count()
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.stderr", self.name))).unwrap_or_default()
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
