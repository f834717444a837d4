//! Decoding what Redis answered: the strict parsing of `LOAD` replies and hash fields (canonical decimals, known
//! schema and layout versions), the stored documents, and the members of the groups index.

use protocol::keys::{fields, LAYOUT_VERSION};
use protocol::messages::GroupRef;
use protocol::metadata::{GroupMetadata, StreamRouting, ROUTING_SCHEMA_VERSION};

use super::group_fields::{self, GroupRead, Resolved, StoredFields, AGGREGATE_SCHEMA, FIELDS_SCHEMA};
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::StoreRevision;
use redis::Value;

use super::section_data::{Cached, Committed, LivenessScope, Loaded, SectionKeys};
use crate::error::StoreError;

/// The groups of the index's `stream:group` members; members that are not valid names are skipped. Sorted.
pub fn group_refs(raw: &[String]) -> Vec<GroupRef> {
    let mut groups: Vec<GroupRef> = raw
        .iter()
        .filter_map(|s| {
            let (stream, group) = s.split_once(':')?;
            Some(GroupRef {
                stream: StreamName::new(stream).ok()?,
                group: GroupName::new(group).ok()?,
            })
        })
        .collect();
    groups.sort();
    groups
}

/// The hash `schemaVersion` of group hashes this build writes (in fields).
pub const fn schema_of_group() -> u32 {
    FIELDS_SCHEMA
}

/// Schema version of routing documents.
pub const fn schema_of_routing() -> u32 {
    ROUTING_SCHEMA_VERSION
}

/// Makes a group load whole ([`group_fields::resolve`]) over what the caller holds, after checking the hash's
/// `schemaVersion` (fields, or the aggregate of the layout before them) and `layoutVersion`.
///
/// # Errors
/// A sentence for the `METADATA_UNAVAILABLE` answer.
pub fn decode_group(loaded: &Loaded, cached: Option<(&GroupMetadata, &StoredFields)>) -> Result<Resolved, String> {
    let (Some(revision), Some(read)) = (loaded.revision, loaded.group.as_ref()) else {
        return Err("the group hash has a revision but no fields".into());
    };
    let schema = match read {
        GroupRead::Aggregate(_) => AGGREGATE_SCHEMA,
        _ => FIELDS_SCHEMA,
    };
    check_versions(loaded, schema)?;
    group_fields::resolve(read, revision, cached).map_err(|e| format!("group metadata is unreadable: {e}"))
}

/// Decodes a routing document whose hash fields were checked already ([`check_versions`], or the checks of
/// `Store::read`).
///
/// # Errors
/// A sentence for the `METADATA_UNAVAILABLE` answer.
pub fn decode_routing(json: &[u8]) -> Result<StreamRouting, String> {
    StreamRouting::decode(json).map_err(|e| format!("stream routing is unreadable: {e}"))
}

/// Checks the hash's `schemaVersion` and `layoutVersion` fields.
///
/// # Errors
/// A sentence naming the unknown version.
pub fn check_versions(loaded: &Loaded, schema: u32) -> Result<(), String> {
    check_version_fields(loaded.schema_version, loaded.layout_version, schema)
}

pub(super) fn check_version_fields(
    schema_version: Option<u32>,
    layout_version: Option<u32>,
    schema: u32,
) -> Result<(), String> {
    if layout_version != Some(LAYOUT_VERSION) {
        return Err(format!(
            "unknown layoutVersion {layout_version:?} (this build understands {LAYOUT_VERSION})"
        ));
    }
    if schema_version != Some(schema) {
        return Err(format!(
            "unknown schemaVersion {schema_version:?} (this build understands {schema})"
        ));
    }
    Ok(())
}

/// The hash fields every read checks (the aggregate aside), in `FIELDS` order of the scripts.
pub(super) const SNAPSHOT_FIELDS: [&str; 6] = [
    fields::REVISION,
    fields::LIVENESS_REVISION,
    fields::SCHEMA_VERSION,
    fields::LAYOUT_VERSION,
    fields::RUN_ID,
    fields::UPDATED_AT,
];

/// Digits of a revision: exact as a Redis integer (`HINCRBY`).
pub(super) const REVISION_DIGITS: usize = 18;
/// Digits of a schema or layout version: a `u32` without truncation.
const VERSION_DIGITS: usize = 9;
/// Digits of a time or lease in ms: exact as a Lua number.
const TIME_DIGITS: usize = 15;
/// The lease end given to a member whose liveness entry does not parse: never ending (2^53 - 1 ms, the largest
/// number the wire carries exactly, shown as such by describe). Its shards are not given away on data nobody can
/// read; its own heartbeats and joins are refused until an operator restores or deletes the field
/// (docs/failure-handling.md).
pub const UNREADABLE_LEASE_MS: u64 = protocol::MetadataVersion::MAX_SAFE.0;
/// Length of a Redis run id.
const RUN_ID_LEN: usize = 40;

/// The text of a hash's fields, parsed strictly by [`Fields::parse`] (the Rust twin of the scripts' checks).
pub(super) struct Fields<'a> {
    pub(super) revision: &'a str,
    pub(super) liveness_revision: &'a str,
    pub(super) schema: &'a str,
    pub(super) layout: &'a str,
    pub(super) run_id: &'a str,
    pub(super) updated_at: &'a str,
}

impl Fields<'_> {
    pub(super) fn parse(
        &self,
        keys: &SectionKeys,
        secs: &str,
        micros: &str,
        live: &[Value],
    ) -> Result<Loaded, StoreError> {
        let field = |name: &str, value: &str, digits: usize| {
            counter(value, digits).map_err(|e| corrupt(keys, &format!("{name} is {e}")))
        };
        let revision = field("revision", self.revision, REVISION_DIGITS)?.map(StoreRevision);
        let liveness_revision = field("livenessRevision", self.liveness_revision, REVISION_DIGITS)?.unwrap_or(0);
        let version = |name: &str, value: &str| -> Result<Option<u32>, StoreError> {
            field(name, value, VERSION_DIGITS)?
                .map(|v| u32::try_from(v).map_err(|e| corrupt(keys, &format!("{name} is {e}"))))
                .transpose()
        };
        let schema_version = version("schemaVersion", self.schema)?;
        let layout_version = version("layoutVersion", self.layout)?;
        field("updatedAt", self.updated_at, TIME_DIGITS)?;
        let run_id_ok = self.run_id.is_empty()
            || (self.run_id.len() == RUN_ID_LEN && self.run_id.bytes().all(|b| b.is_ascii_hexdigit()));
        if !run_id_ok {
            return Err(corrupt(keys, &format!("runId is {}", quoted(self.run_id))));
        }
        let mut liveness = Vec::with_capacity(live.len() / 2);
        for pair in live.chunks(2) {
            let (Some(k), Some(v)) = (pair.first(), pair.get(1)) else {
                return Err(StoreError::Protocol("odd liveness reply".into()));
            };
            let (k, v) = (value_text(k)?, value_text(v)?);
            let member = MemberId::new(k.as_str())
                .map_err(|e| corrupt(keys, &format!("liveness member {} is invalid: {e}", quoted(&k))))?;
            // Fail closed for this member only: nobody may act on a lease nobody can read (see
            // `UNREADABLE_LEASE_MS`). A load that would renew it refused it in `LOAD` already.
            let lease = counter(&v, TIME_DIGITS).ok().flatten().unwrap_or(UNREADABLE_LEASE_MS);
            liveness.push((member, lease));
        }
        let secs = secs.parse::<u64>().map_err(bad)?;
        let micros = micros.parse::<u64>().map_err(bad)?;
        Ok(Loaded {
            now_ms: time_ms(secs, micros),
            revision,
            liveness_revision,
            schema_version,
            layout_version,
            aggregate: None,
            group: None,
            aggregate_digest: String::new(),
            cache_hit: false,
            liveness,
            stored_run_id: self.run_id.to_owned(),
            run_id: String::new(),
            liveness_missing: false,
        })
    }
}

/// Parses the reply of a `COMMIT` or `GROUP_COMMIT`: written at a revision, a conflict, or a corrupt hash.
pub(super) fn committed(reply: &[Value], keys: &SectionKeys) -> Result<Committed, StoreError> {
    match int(reply, 0)? {
        1 => {
            let rev = counter(&text(reply, 1)?, REVISION_DIGITS)
                .map_err(|e| corrupt(keys, &format!("revision is {e}")))?
                .unwrap_or(0);
            Ok(Committed::Ok(StoreRevision(rev)))
        }
        2 => Err(corrupt(keys, &text(reply, 1)?)),
        _ => Ok(Committed::Conflict),
    }
}

/// Parses a `LOAD` reply that took the mutex.
pub(super) fn parse_loaded(reply: &[Value], keys: &SectionKeys) -> Result<Loaded, StoreError> {
    let live = match reply.get(8) {
        Some(Value::Array(items)) => items.as_slice(),
        _ => &[],
    };
    let fields = Fields {
        revision: &text(reply, 3)?,
        liveness_revision: &text(reply, 4)?,
        schema: &text(reply, 5)?,
        layout: &text(reply, 6)?,
        run_id: &text(reply, 9)?,
        updated_at: "",
    };
    let mut loaded = fields.parse(keys, &text(reply, 1)?, &text(reply, 2)?, live)?;
    loaded.aggregate = match reply.get(7) {
        Some(Value::BulkString(b)) if !b.is_empty() => Some(b.clone()),
        _ => None,
    };
    if let Some(json) = &loaded.aggregate {
        loaded.aggregate_digest = digest(json);
    }
    loaded.run_id = text(reply, 10)?;
    loaded.liveness_missing = int(reply, 11)? == 0;
    loaded.cache_hit = int(reply, 12)? == 1;
    Ok(loaded)
}

/// What `LOAD` compares with the stored aggregate: its length on every load (O(1) in Redis), its digest on
/// loads of all liveness (ticks and fences, a few per second per group) so that an edit that keeps the length is
/// noticed within a tick, without hashing a large aggregate on every heartbeat.
pub(super) fn check_of(cached: Cached<'_>, scope: LivenessScope<'_>) -> String {
    match scope {
        LivenessScope::All => format!("sha1:{}", cached.digest),
        _ => format!("len:{}", cached.len),
    }
}

/// Redis `TIME` (seconds, microseconds) in ms.
pub(super) fn time_ms(secs: u64, micros: u64) -> u64 {
    secs * 1000 + micros / 1000
}

/// The digest `LOAD` compares with a cached aggregate's: SHA-1 in hex, as Redis's `redis.sha1hex`.
pub fn digest(json: &[u8]) -> String {
    sha1_smol::Sha1::from(json).digest().to_string()
}

/// A canonical decimal of at most `digits` digits; empty is `None`. The error quotes the value.
pub(super) fn counter(s: &str, digits: usize) -> Result<Option<u64>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let canonical = s.len() <= digits && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if !canonical {
        return Err(quoted(s));
    }
    s.parse().map(Some).map_err(|_| quoted(s))
}

/// A stored value for a message: quoted, and cut so a huge field does not flood a log line.
pub(super) fn quoted(s: &str) -> String {
    let cut: String = s.chars().take(40).collect();
    format!("{cut:?}")
}

pub(super) fn corrupt(keys: &SectionKeys, why: &str) -> StoreError {
    StoreError::Corrupt(format!("{} is unreadable: {why}", keys.hash))
}

pub(super) fn bad<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Protocol(e.to_string())
}

pub(super) fn int(reply: &[Value], i: usize) -> Result<i64, StoreError> {
    match reply.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(StoreError::Protocol(format!(
            "expected an integer at {i}, got {other:?}"
        ))),
    }
}

pub(super) fn text(reply: &[Value], i: usize) -> Result<String, StoreError> {
    match reply.get(i) {
        Some(v) => value_text(v),
        None => Ok(String::new()),
    }
}

pub(super) fn value_text(v: &Value) -> Result<String, StoreError> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).map_err(bad),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(n) => Ok(n.to_string()),
        Value::Nil => Ok(String::new()),
        other => Err(StoreError::Protocol(format!("expected text, got {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_canonical_decimals() {
        assert_eq!(counter("", REVISION_DIGITS), Ok(None));
        assert_eq!(counter("0", REVISION_DIGITS), Ok(Some(0)));
        assert_eq!(counter("42", REVISION_DIGITS), Ok(Some(42)));
        for bad in ["07", "-1", "+1", " 1", "1 ", "1e3", "0x10", "12x", "１"] {
            assert!(counter(bad, REVISION_DIGITS).is_err(), "{bad:?}");
        }
        assert_eq!(
            counter("999999999999999999", REVISION_DIGITS),
            Ok(Some(999_999_999_999_999_999))
        );
        assert!(counter("1000000000000000000", REVISION_DIGITS).is_err(), "19 digits");
    }

    #[test]
    fn versions_are_never_truncated() {
        let keys = SectionKeys::routing(&StreamName::new("s").unwrap());
        let fields = |schema| Fields {
            revision: "1",
            liveness_revision: "0",
            schema,
            layout: "1",
            run_id: "",
            updated_at: "",
        };
        let parsed = fields("1").parse(&keys, "1", "0", &[]).unwrap();
        assert_eq!(parsed.schema_version, Some(1));
        // 2^32 + 1 would be 1 after an `as u32`.
        let err = fields("4294967297").parse(&keys, "1", "0", &[]).unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt(ref m) if m.contains("schemaVersion")),
            "{err:?}"
        );
    }
}
