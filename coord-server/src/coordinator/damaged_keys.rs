//! Damaged coordinator keys: the due index, the groups index and routing hashes found of the wrong type, holding
//! garbage, or lost. None of them may stop expiry, fencing or routing adoption of a group whose own keys are
//! intact (DESIGN-NOTES, "Damage to one coordinator key stops nothing else"): the sweep lists the groups from the
//! groups index or, when that is unreadable, by `SCAN`; a group whose routing is unreadable is ticked without
//! adopting. Every finding is counted ([`crate::metrics::names::DAMAGED_KEYS`]) and logged at most once per
//! [`LOG_WINDOW`] and kind; an index is repaired only where the repair provably loses nothing (see
//! [`Coordinator::sweep_groups`] and [`Coordinator::repair_due_index`]); anything else is only reported.

use protocol::messages::GroupRef;
use protocol::names::StreamName;
use std::sync::LazyLock;
use std::time::Duration;
use tracing::warn;

use super::{Coordinator, INDEX_REBUILD_PERIOD};
use crate::error::{Error, StoreError};
use crate::log_limit::LogLimiter;
use crate::store;

/// At most one warning per kind of damage (and stream, for routings) in this window; the counter counts all.
pub const LOG_WINDOW: Duration = Duration::from_secs(30);

/// Warnings of damaged keys and failed index writes, thinned (a damaged key is seen on every tick, 4 a second).
static DAMAGE_LOGS: LazyLock<LogLimiter> = LazyLock::new(|| LogLimiter::new(LOG_WINDOW, 64));

/// A coordinator key that can be damaged (the `key` label of the metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DamagedKey {
    /// `redis-stream:coord:due`, a sorted set.
    DueIndex,
    /// `redis-stream:coord:groups`, a set.
    GroupsIndex,
    /// A stream's routing hash.
    Routing,
}

impl DamagedKey {
    fn as_str(self) -> &'static str {
        match self {
            DamagedKey::DueIndex => "due_index",
            DamagedKey::GroupsIndex => "groups_index",
            DamagedKey::Routing => "routing",
        }
    }
}

/// What is wrong with it (the `damage` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Damage {
    /// Another Redis type than the key must have (`WRONGTYPE`).
    WrongType,
    /// Members that name no group, or a document that does not parse.
    Garbage,
    /// Entries the index lacked, or a routing missing under a group that exists.
    Lost,
}

impl Damage {
    fn as_str(self) -> &'static str {
        match self {
            Damage::WrongType => "wrong_type",
            Damage::Garbage => "garbage",
            Damage::Lost => "lost",
        }
    }
}

/// Whether Redis refused a command because the key holds another type.
pub(crate) fn is_wrong_type(e: &StoreError) -> bool {
    match e {
        StoreError::Redis(r) => r.code() == Some("WRONGTYPE") || r.to_string().contains("WRONGTYPE"),
        StoreError::Node { source, .. } => is_wrong_type(source),
        _ => false,
    }
}

/// Logs a warning unless one with `key` was logged within [`LOG_WINDOW`]; says how many were left out.
pub(crate) fn warn_limited(key: &str, message: &str, detail: &dyn std::fmt::Display) {
    if let Some(suppressed) = DAMAGE_LOGS.admit(key) {
        warn!(suppressed, detail = %detail, "{message}");
    }
}

impl Coordinator {
    /// Counts `n` findings of `damage` in `key` and logs one line per kind (and stream) and [`LOG_WINDOW`].
    pub(crate) fn report_damage(
        &self,
        key: DamagedKey,
        damage: Damage,
        n: u64,
        stream: Option<&StreamName>,
        detail: &dyn std::fmt::Display,
    ) {
        if n == 0 {
            return;
        }
        self.inner.stats.metrics().damaged_key(key.as_str(), damage.as_str(), n);
        let (key, damage) = (key.as_str(), damage.as_str());
        let limit = match stream {
            Some(s) => format!("damaged/{key}/{damage}/{s}"),
            None => format!("damaged/{key}/{damage}"),
        };
        if let Some(suppressed) = DAMAGE_LOGS.admit(&limit) {
            match stream {
                Some(s) => warn!(key, damage, n, suppressed, stream = %s, detail = %detail, "damaged coordinator key"),
                None => warn!(key, damage, n, suppressed, detail = %detail, "damaged coordinator key"),
            }
        }
    }

    fn report_repair(&self, key: DamagedKey, n: usize) {
        self.inner.stats.metrics().damaged_key_repaired(key.as_str());
        warn!(
            key = key.as_str(),
            groups = n,
            "replaced a coordinator index of the wrong type by a rebuilt one"
        );
    }

    /// The groups the safety sweep visits (see [`crate::due`]): the groups index, rebuilt by `SCAN` at most every
    /// [`INDEX_REBUILD_PERIOD`] (a lost or incomplete index must not stop expiry), plus every group a load of this
    /// process found within [`super::SLOT_RETENTION`]. Groups that requests merely named are not visited: the
    /// tick's cost follows the groups that exist, not the names clients send.
    ///
    /// A damaged groups index stops none of it: members that name no group are skipped and counted (and left in
    /// place: a later build may read them); an index of the wrong type is read by `SCAN` instead, and replaced by
    /// a set of what the `SCAN` found. That repair loses nothing: a key of another type holds no member any reader
    /// could use (the index is also the trace that tells a lost group from one never created, and a wrong type
    /// answered no such question either), and every group whose metadata exists is found by the `SCAN`. The
    /// replacement is one script that checks the type first, so a set another replica rebuilt meanwhile is kept.
    ///
    /// # Errors
    /// Redis errors other than a damaged index.
    pub async fn sweep_groups(&self) -> Result<Vec<GroupRef>, Error> {
        let store = &self.inner.store;
        let rebuild = {
            let mut last = self.inner.index_rebuilt_at.lock().expect("index lock");
            let due = last.due(INDEX_REBUILD_PERIOD);
            if due {
                last.mark();
            }
            due
        };
        let indexed = match store.indexed_groups().await {
            Ok(raw) => {
                let groups = store::group_refs(&raw);
                let garbage = (raw.len() - groups.len()) as u64;
                self.report_damage(
                    DamagedKey::GroupsIndex,
                    Damage::Garbage,
                    garbage,
                    None,
                    &"members that name no group are skipped (left in place)",
                );
                Some(groups)
            }
            Err(e) if is_wrong_type(&e) => {
                self.report_damage(DamagedKey::GroupsIndex, Damage::WrongType, 1, None, &e);
                None
            }
            Err(e) => return Err(e.into()),
        };
        // The index is read every round, also when it is rebuilt: what the index holds and `SCAN` does not see
        // yet costs nothing to include.
        let mut groups = match indexed {
            Some(groups) if !rebuild => groups,
            Some(mut groups) => {
                let found = store.scan_groups().await?;
                // A group `SCAN` finds and the index lacks was lost from it (or is being created right now: its
                // metadata is written a moment before its index entry, a rare overlap with a rebuild).
                let lacked = store.add_to_groups_index(&found).await?;
                self.report_damage(
                    DamagedKey::GroupsIndex,
                    Damage::Lost,
                    lacked,
                    None,
                    &"groups found by SCAN were added again",
                );
                groups.extend(store::group_refs(&found));
                groups
            }
            None => {
                let found = store.scan_groups().await?;
                match store.replace_groups_index_of_wrong_type(&found).await {
                    Ok(true) => self.report_repair(DamagedKey::GroupsIndex, found.len()),
                    Ok(false) => {}
                    Err(e) => warn_limited(
                        "repair/groups_index",
                        "cannot replace the groups index of the wrong type; the sweep reads metadata keys by SCAN",
                        &e,
                    ),
                }
                store::group_refs(&found)
            }
        };
        groups.extend(self.inner.slots.retained());
        groups.sort();
        groups.dedup();
        Ok(groups)
    }

    /// Replaces a due index of the wrong type by one that makes every group of the sweep's list due at once.
    /// At most one try per [`INDEX_REBUILD_PERIOD`] (a repair the ACL refuses is not retried on every tick).
    ///
    /// Safe: the due index is rebuildable by design. A visit before a group's deadline finds nothing to do and
    /// writes nothing but the group's true score (`state_machine::due`'s property tests: a tick before the due
    /// time is a no-op), so "every group due now" is never wrong, only early; the sweep's visits would write the
    /// same scores within a period. The replacement checks the type in the same script, so an index another
    /// replica already rebuilt is kept.
    pub(crate) async fn repair_due_index(&self) {
        if !self
            .inner
            .sweep
            .lock()
            .expect("sweep lock")
            .repair_due(INDEX_REBUILD_PERIOD)
        {
            return;
        }
        let result = async {
            let groups = self.sweep_groups().await?;
            let members: Vec<String> = groups
                .iter()
                .map(|g| protocol::keys::groups_index_member(&g.stream, &g.group))
                .collect();
            let replaced = self.inner.store.replace_due_index_of_wrong_type(&members).await?;
            Ok::<_, Error>((replaced, members.len()))
        }
        .await;
        match result {
            Ok((true, n)) => self.report_repair(DamagedKey::DueIndex, n),
            Ok((false, _)) => {}
            Err(e) => warn_limited(
                "repair/due_index",
                "cannot replace the due index of the wrong type; the safety sweep keeps expiry within its period",
                &e,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{DAMAGED_KEY_LABELS, DAMAGE_LABELS, REPAIRABLE_KEY_LABELS};

    #[test]
    fn every_label_is_one_the_metrics_register() {
        for k in [DamagedKey::DueIndex, DamagedKey::GroupsIndex, DamagedKey::Routing] {
            assert!(DAMAGED_KEY_LABELS.contains(&k.as_str()), "{k:?}");
        }
        for d in [Damage::WrongType, Damage::Garbage, Damage::Lost] {
            assert!(DAMAGE_LABELS.contains(&d.as_str()), "{d:?}");
        }
        for k in REPAIRABLE_KEY_LABELS {
            assert!(DAMAGED_KEY_LABELS.contains(k));
        }
    }

    #[test]
    fn wrong_type_is_told_from_other_failures() {
        // A real server's WRONGTYPE is in `tests/damaged_keys.rs`; here the text a script error carries.
        let wrong = redis::RedisError::from((
            redis::ErrorKind::Extension,
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value script: 1234".to_owned(),
        ));
        assert!(is_wrong_type(&StoreError::Redis(wrong.clone())));
        assert!(is_wrong_type(&StoreError::Redis(wrong).on_node("127.0.0.1:7000")));
        assert!(!is_wrong_type(&StoreError::Protocol("WRONGTYPE".into())));
        let io = redis::RedisError::from(std::io::Error::other("connection reset"));
        assert!(!is_wrong_type(&StoreError::Redis(io)));
    }
}
