//! Spawning a [`RedisServer`]'s process from its generated `redis.conf`, and the readiness check after it.

use std::fs::{self, File, OpenOptions};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::{AsyncConnectionConfig, RedisError};
use tokio::time::{sleep, Instant};

use super::{info_field, RedisServer, READY_TIMEOUT, SERVER_BIN_ENV, STDIO_FILE};
use crate::wait::POLL_INTERVAL;

const CONF_FILE: &str = "redis.conf";
const BIND_RACE_MARKER: &str = "Address already in use";

/// Why a launch did not give a ready server.
#[derive(Debug)]
pub(super) enum LaunchFailure {
    /// `redis-server` exited because its port was taken: another port (or, on restart, a later try) may work.
    BindRace,
    /// Anything else, as a sentence (the server's log is added by the caller).
    Failed(String),
}

impl RedisServer {
    /// Spawns `redis-server` with the current configuration and waits until
    /// it is ready.
    pub(super) async fn launch(&mut self) -> Result<(), LaunchFailure> {
        let replica_of = self.state().replica_of;
        let conf_path = self.dir().join(CONF_FILE);
        fs::write(&conf_path, self.config_text(replica_of))
            .unwrap_or_else(|e| self.fail(format_args!("cannot write {}: {e}", conf_path.display())));
        if !self.options.persistence {
            self.remove_rdb_files();
        }
        let log_offset = fs::metadata(self.log_path()).map(|m| m.len()).unwrap_or(0);

        let stdio = self.open_stdio_file();
        let stderr = stdio
            .try_clone()
            .unwrap_or_else(|e| self.fail(format_args!("cannot clone a file handle: {e}")));
        let bin = self.bin();
        let child = Command::new(&bin)
            .arg(&conf_path)
            .args(&self.options.extra_args)
            .current_dir(self.dir())
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stderr)
            .spawn()
            .map_err(|e| {
                LaunchFailure::Failed(format!(
                    "cannot spawn {:?} (set {SERVER_BIN_ENV} to the redis-server binary): {e}",
                    bin
                ))
            })?;
        tracing::debug!(port = self.port, pid = child.id(), "started redis-server");
        self.state().child = Some(child);
        self.wait_ready(log_offset, replica_of).await
    }

    /// Waits until the freshly spawned process answers `PING`, has finished
    /// loading, and (for a replica) has its link to the primary up.
    async fn wait_ready(&self, log_offset: u64, replica_of: Option<u16>) -> Result<(), LaunchFailure> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let exit = {
                let mut state = self.state();
                match state.child.as_mut().map(Child::try_wait) {
                    Some(Ok(Some(status))) => {
                        state.child = None;
                        Some(status.to_string())
                    }
                    Some(Ok(None)) => None,
                    Some(Err(e)) => Some(format!("unknown status ({e})")),
                    None => Some("not running".to_owned()),
                }
            };
            if let Some(status) = exit {
                if self.log_since(log_offset).contains(BIND_RACE_MARKER) {
                    return Err(LaunchFailure::BindRace);
                }
                return Err(LaunchFailure::Failed(format!(
                    "redis-server on port {} exited during start-up ({status})",
                    self.port
                )));
            }
            let problem = match self.probe(replica_of).await {
                Ok(None) => return Ok(()),
                Ok(Some(problem)) => problem,
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                self.kill();
                return Err(LaunchFailure::Failed(format!(
                    "redis-server on port {} was not ready within {READY_TIMEOUT:?}: {problem}",
                    self.port
                )));
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    /// One readiness check: `Ok(None)` when ready, `Ok(Some(reason))` when
    /// not ready yet.
    async fn probe(&self, replica_of: Option<u16>) -> Result<Option<String>, RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_secs(1)));
        let mut con = self
            .client()
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let pong: String = redis::cmd("PING").query_async(&mut con).await?;
        if pong != "PONG" {
            return Ok(Some(format!("PING answered {pong:?}")));
        }
        // Another process may have taken the port before this one bound it.
        let server: String = redis::cmd("INFO").arg("server").query_async(&mut con).await?;
        let pid = self.pid().map(|pid| pid.to_string());
        if info_field(&server, "process_id") != pid.as_deref() {
            return Ok(Some(format!(
                "port {} is served by process {:?}, not by {pid:?}",
                self.port,
                info_field(&server, "process_id")
            )));
        }
        let persistence: String = redis::cmd("INFO").arg("persistence").query_async(&mut con).await?;
        if info_field(&persistence, "loading") != Some("0") {
            return Ok(Some("still loading the data set".to_owned()));
        }
        if replica_of.is_some() {
            let replication: String = redis::cmd("INFO").arg("replication").query_async(&mut con).await?;
            let link = info_field(&replication, "master_link_status");
            if link != Some("up") {
                return Ok(Some(format!("master_link_status is {link:?}")));
            }
        }
        Ok(None)
    }

    fn config_text(&self, replica_of: Option<u16>) -> String {
        let mut lines = vec![
            "# generated by test-support; rewritten on every (re)start".to_owned(),
            "bind 127.0.0.1".to_owned(),
            "protected-mode no".to_owned(),
            "daemonize no".to_owned(),
            format!("dir {}", quote(&self.dir().to_string_lossy())),
            format!("logfile {}", quote(&self.log_path().to_string_lossy())),
            // Disk-based full synchronisation: the primary puts the replica
            // online as soon as the RDB is sent. With diskless sync it waits
            // for the replica's first periodic ACK, up to a second later, and
            // WAIT stalls until then.
            "repl-diskless-sync no".to_owned(),
            "save \"\"".to_owned(),
        ];
        match &self.options.tls {
            Some(tls) => lines.extend(tls.config_lines(self.port, self.options.cluster_node_timeout_ms.is_some())),
            None => lines.push(format!("port {}", self.port)),
        }
        if self.options.persistence {
            lines.push("appendonly yes".to_owned());
            lines.push("appendfsync always".to_owned());
        } else {
            lines.push("appendonly no".to_owned());
            // Delete the RDB files written for replication, so a restart
            // really comes back empty.
            lines.push("rdb-del-sync-files yes".to_owned());
        }
        for (name, new_name) in &self.options.renamed_commands {
            lines.push(format!("rename-command {} {}", quote(name), quote(new_name)));
        }
        if let Some(primary) = replica_of {
            lines.push(format!("replicaof 127.0.0.1 {primary}"));
        }
        if let (Some(timeout), Some(bus_port)) = (self.options.cluster_node_timeout_ms, self.bus_port) {
            lines.push("cluster-enabled yes".to_owned());
            lines.push(format!("cluster-port {bus_port}"));
            // Relative to `dir`: kept across restarts, so a restarted node keeps its id and its view.
            lines.push("cluster-config-file nodes.conf".to_owned());
            lines.push(format!("cluster-node-timeout {timeout}"));
        }
        let mut conf = lines.join("\n");
        conf.push('\n');
        conf
    }

    /// Deletes the RDB files a full synchronisation may have left in the
    /// directory, so a server without persistence starts empty.
    fn remove_rdb_files(&self) {
        let Ok(entries) = fs::read_dir(self.dir()) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == "rdb") {
                fs::remove_file(&path)
                    .unwrap_or_else(|e| self.fail(format_args!("cannot delete {}: {e}", path.display())));
            }
        }
    }

    fn open_stdio_file(&self) -> File {
        let path = self.dir().join(STDIO_FILE);
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| self.fail(format_args!("cannot open {}: {e}", path.display())))
    }

    /// The part of the log file written after byte `offset`.
    fn log_since(&self, offset: u64) -> String {
        let bytes = fs::read(self.log_path()).unwrap_or_default();
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }
}

/// Quotes a value for `redis.conf`.
pub(super) fn quote(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        if c == '"' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn quote_escapes() {
        assert_eq!(quote(""), "\"\"");
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
