//! The Redis `maxmemory-policy` precondition: the coordinator's metadata, liveness and mutexes must never be
//! evicted, so Redis must run with `noeviction` (a full Redis then refuses writes, which the coordinator turns
//! into `STORE_UNAVAILABLE`, instead of silently dropping a group's metadata or a held mutex).
//!
//! The policy is read from `INFO memory` (field `maxmemory_policy`), not `CONFIG GET`, because the deployment ACL
//! denies `CONFIG` to the coordinator's user. It is read at start, every [`CHECK_PERIOD`] by the tick loop, and by
//! every `/readyz` probe (a policy changed at run time with `CONFIG SET` is noticed within one probe). Anything but
//! `noeviction` makes the instance unready, sets the metric `redis_stream_coord_redis_eviction_policy_unsafe`,
//! logs an error and refuses to create groups, unless the operator accepted it with `accept_eviction_policy`.

use std::sync::Mutex;
use std::time::Duration;

use crate::clock::LastRun;
use crate::error::StoreError;
use crate::log_limit::LogLimiter;
use crate::store::Store;

/// The one policy under which Redis never drops a key the coordinator wrote.
pub const REQUIRED_POLICY: &str = "noeviction";

/// How often the tick loop reads the policy again.
pub const CHECK_PERIOD: Duration = Duration::from_secs(10);

/// How often the error about an unsafe policy is repeated while it lasts.
const LOG_PERIOD: Duration = Duration::from_secs(60);

/// What the last check found.
#[derive(Debug)]
pub struct PolicyCheck {
    accepted: bool,
    state: Mutex<State>,
    logs: LogLimiter,
}

#[derive(Debug, Default)]
struct State {
    /// The policy Redis reported last, `None` before the first check.
    policy: Option<String>,
    checked_at: LastRun,
}

impl PolicyCheck {
    /// A check that has not run yet; `accepted` lets an unsafe policy through (deliberate operator choice).
    pub fn new(accepted: bool) -> Self {
        PolicyCheck {
            accepted,
            state: Mutex::new(State::default()),
            logs: LogLimiter::new(LOG_PERIOD, 4),
        }
    }

    /// Records what Redis reported. Returns whether the policy is `noeviction`.
    pub fn record(&self, policy: &str) -> bool {
        let safe = policy == REQUIRED_POLICY;
        {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.policy = Some(policy.to_owned());
            state.checked_at.mark();
        }
        if !safe {
            if let Some(suppressed) = self.logs.admit(policy) {
                if self.accepted {
                    tracing::warn!(maxmemory_policy = %policy, suppressed,
                        "Redis may evict coordinator keys (maxmemory-policy is not noeviction); accepted by \
                         configuration: a group's metadata or mutex can vanish under memory pressure");
                } else {
                    tracing::error!(maxmemory_policy = %policy, suppressed,
                        "Redis maxmemory-policy must be noeviction: under memory pressure it would evict group \
                         metadata, liveness or a held mutex. This instance stays unready and creates no group \
                         until the policy is noeviction (CONFIG SET maxmemory-policy noeviction), or the risk is \
                         accepted with --accept-eviction-policy");
                }
            }
        }
        safe
    }

    /// The policy Redis reported last, if any check ran.
    pub fn policy(&self) -> Option<String> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).policy.clone()
    }

    /// Whether an unsafe policy is accepted by configuration.
    pub fn accepted(&self) -> bool {
        self.accepted
    }

    /// `Err(sentence)` while the last reported policy is unsafe and not accepted; `Ok` before the first check.
    pub fn require_safe(&self) -> Result<(), String> {
        match self.policy() {
            Some(p) if p != REQUIRED_POLICY && !self.accepted => Err(format!(
                "Redis maxmemory-policy is {p}; the coordinator requires {REQUIRED_POLICY} (or \
                 --accept-eviction-policy)"
            )),
            _ => Ok(()),
        }
    }

    /// Whether the periodic check is due.
    pub fn due(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.checked_at.due(CHECK_PERIOD)
    }
}

/// Reads `maxmemory_policy` from `INFO memory`. On a cluster every master is read: the answer is
/// [`REQUIRED_POLICY`] when every master has it, else the first other policy followed by the node that has it
/// (`allkeys-lru on 10.0.0.2:7001`), so the log and `/readyz` name the node to fix. With a metadata Redis of its
/// own, both Redis are read: the data Redis holds the shard fences, whose eviction would let stale producers write.
///
/// # Errors
/// Redis errors; [`StoreError::Protocol`] when the field is missing (both naming the cluster node).
pub async fn read(store: &Store) -> Result<String, StoreError> {
    let mut infos = store.info("memory").await?;
    if store.split() {
        infos.extend(store.data().info("memory").await?);
    }
    let mut unsafe_policy = None;
    for (node, info) in infos {
        let Some(policy) = parse(&info) else {
            let e = StoreError::Protocol("INFO memory reports no maxmemory_policy".into());
            return Err(match node {
                Some(node) => e.on_node(node),
                None => e,
            });
        };
        if policy != REQUIRED_POLICY && unsafe_policy.is_none() {
            unsafe_policy = Some(match node {
                Some(node) => format!("{policy} on {node}"),
                None => policy.to_owned(),
            });
        }
    }
    Ok(unsafe_policy.unwrap_or_else(|| REQUIRED_POLICY.to_owned()))
}

/// The `maxmemory_policy` field of an `INFO memory` reply.
pub fn parse(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|l| l.strip_prefix("maxmemory_policy:"))
        .map(str::trim)
        .filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_policy_from_info_memory() {
        let info = "# Memory\r\nused_memory:1\r\nmaxmemory_policy:allkeys-lru\r\nmem_fragmentation_ratio:1\r\n";
        assert_eq!(parse(info), Some("allkeys-lru"));
        assert_eq!(parse("# Memory\r\nmaxmemory_policy:\r\n"), None);
        assert_eq!(parse("# Memory\r\n"), None);
    }

    #[test]
    fn only_noeviction_is_safe_unless_accepted() {
        let strict = PolicyCheck::new(false);
        assert!(strict.require_safe().is_ok(), "nothing known before the first check");
        assert!(strict.due());
        assert!(!strict.record("allkeys-lru"));
        assert!(!strict.due());
        assert!(strict.require_safe().unwrap_err().contains("allkeys-lru"));
        assert!(strict.record("noeviction"));
        assert!(strict.require_safe().is_ok());

        let lenient = PolicyCheck::new(true);
        assert!(!lenient.record("volatile-lru"), "still reported unsafe");
        assert!(lenient.require_safe().is_ok(), "but accepted");
    }

    #[tokio::test(start_paused = true)]
    async fn the_policy_is_due_again_one_check_period_after_the_last_check() {
        let check = PolicyCheck::new(false);
        assert!(check.due(), "never checked");
        check.record("noeviction");
        tokio::time::advance(CHECK_PERIOD - Duration::from_millis(1)).await;
        assert!(!check.due());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(check.due());
        check.record("noeviction");
        assert!(!check.due(), "a check starts a new period");
    }
}
