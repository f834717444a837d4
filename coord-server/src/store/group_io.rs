//! The round trips of a group hash kept in fields ([`super::group_fields`]): `GROUP_LOAD`, `GROUP_COMMIT` and the
//! snapshot read. Same contract as the routing hash's `LOAD` and `COMMIT` (see the store's module docs); what
//! differs is what travels: the changes since the caller's revision, and the changed fields.

use protocol::keys::{fields, LAYOUT_VERSION};
use protocol::StoreRevision;
use redis::Value;

use super::decode::{check_versions, committed, corrupt, int, text, value_text, Fields};
use super::group_fields::{DeltaRead, GroupRead, AGGREGATE_SCHEMA};
use super::section::{Ask, Attempt};
use super::section_data::{Cached, Committed, LivenessScope, Loaded, SectionKeys, Write};
use super::Store;
use crate::error::StoreError;
use protocol::names::MemberId;

impl Store {
    /// A group's metadata as stored (a snapshot without the mutex, checked as strictly as a load), `None` when
    /// the group has no metadata hash. For tools and tests that look at what the coordinator wrote.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a hash or field that does not parse; Redis errors.
    pub async fn group_metadata(
        &self,
        stream: &protocol::names::StreamName,
        group: &protocol::names::GroupName,
    ) -> Result<Option<protocol::metadata::GroupMetadata>, StoreError> {
        let keys = SectionKeys::group(stream, group);
        let loaded = self.read_group(&keys, false).await?;
        if loaded.revision.is_none() {
            return Ok(None);
        }
        super::decode_group(&loaded, None)
            .map(|(meta, _)| Some(meta))
            .map_err(|e| corrupt(&keys, &e))
    }

    pub(super) async fn load_group_once(&self, ask: &Ask<'_>) -> Result<Attempt, StoreError> {
        let Ask {
            keys,
            token,
            mutex_ttl,
            cached,
            scope,
        } = *ask;
        let (scope_arg, members): (&str, Vec<&MemberId>) = match scope {
            LivenessScope::None => ("", Vec::new()),
            LivenessScope::Member(m) => ("m", vec![m]),
            LivenessScope::Members(ms) => ("m", ms.to_vec()),
            LivenessScope::All => ("*", Vec::new()),
        };
        // The caller's shape check, or without one (a tick that verifies) the digest of every field.
        let check = match cached {
            Some(Cached { shape: Some(shape), .. }) => shape.to_owned(),
            Some(c) => format!("xor:{}", c.digest),
            None => String::new(),
        };
        let mut conn = self.conn.clone();
        let mut inv = self.group_load.key(&keys.hash);
        inv.key(&keys.liveness)
            .key(&keys.mutex)
            .arg(token)
            .arg(mutex_ttl.as_millis() as u64)
            .arg(cached.map(|c| c.revision.0.to_string()).unwrap_or_default())
            .arg(check)
            .arg(keys.schema)
            .arg(AGGREGATE_SCHEMA)
            .arg(LAYOUT_VERSION)
            .arg(scope_arg);
        for m in members {
            inv.arg(m.as_str());
        }
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        match int(&reply, 0)? {
            0 => return Ok(Attempt::Busy(text(&reply, 1)?)),
            2 => return Err(corrupt(keys, &text(&reply, 1)?)),
            _ => {}
        }
        match parse_group_loaded(&reply, keys) {
            Ok(mut loaded) => {
                if loaded.run_id_changed() && self.nodes.is_some() {
                    self.explain_moved_run_id(keys, &mut loaded).await;
                }
                Ok(Attempt::Loaded(loaded))
            }
            Err(e) => {
                self.release(keys, token).await?;
                Err(e)
            }
        }
    }

    pub(super) async fn commit_group(
        &self,
        keys: &SectionKeys,
        token: &str,
        expected: Option<StoreRevision>,
        expected_liveness: u64,
        write: &Write<'_>,
    ) -> Result<Committed, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = self.group_commit.key(&keys.hash);
        let changes = write.fields.map(|f| f.changes.as_slice()).unwrap_or_default();
        inv.key(&keys.liveness)
            .key(&keys.mutex)
            .arg(token)
            .arg(expected.map(|r| r.0.to_string()).unwrap_or_default())
            .arg(expected_liveness.to_string())
            .arg(keys.schema)
            .arg(AGGREGATE_SCHEMA)
            .arg(LAYOUT_VERSION)
            .arg(write.now_ms)
            .arg(write.run_id)
            .arg(write.fields.map(|f| f.converts.as_str()).unwrap_or_default())
            .arg(changes.len());
        for (name, json, expect) in changes {
            let (op, json) = match json {
                Some(json) => ("s", json.as_str()),
                None => ("d", ""),
            };
            inv.arg(name).arg(expect).arg(op).arg(json);
        }
        inv.arg(write.renew.len());
        for (m, lease) in write.renew {
            inv.arg(m.as_str()).arg(*lease);
        }
        for m in write.forget {
            inv.arg(m.as_str());
        }
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        committed(&reply, keys)
    }

    /// A snapshot of a group hash without the mutex: every field (`HGETALL`), checked as strictly as a load.
    pub(super) async fn read_group(&self, keys: &SectionKeys, liveness: bool) -> Result<Loaded, StoreError> {
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL").arg(&keys.hash);
        pipe.cmd("TIME");
        if liveness {
            pipe.cmd("HGETALL").arg(&keys.liveness);
        }
        let replies: Vec<Value> = pipe.query_async(&mut conn).await?;
        let pairs = pairs_of(replies.first())?;
        let (secs, micros) = match replies.get(1) {
            Some(Value::Array(t)) => (text(t, 0)?, text(t, 1)?),
            other => return Err(StoreError::Protocol(format!("TIME replied {other:?}"))),
        };
        let live = flat(replies.get(2));
        let header = |name: &str| -> Result<String, StoreError> {
            match pairs.iter().find(|(n, _)| n == name) {
                Some((_, v)) => String::from_utf8(v.clone()).map_err(|_| corrupt(keys, &format!("{name} is not text"))),
                None => Ok(String::new()),
            }
        };
        let fields = Fields {
            revision: &header(fields::REVISION)?,
            liveness_revision: &header(fields::LIVENESS_REVISION)?,
            schema: &header(fields::SCHEMA_VERSION)?,
            layout: &header(fields::LAYOUT_VERSION)?,
            run_id: &header(fields::RUN_ID)?,
            updated_at: &header(fields::UPDATED_AT)?,
        };
        let mut loaded = fields.parse(keys, &secs, &micros, &live)?;
        if loaded.revision.is_some() {
            if loaded.schema_version == Some(AGGREGATE_SCHEMA) {
                check_versions(&loaded, AGGREGATE_SCHEMA).map_err(|e| corrupt(keys, &e))?;
                let agg = pairs.into_iter().find(|(n, _)| n == fields::AGGREGATE).map(|(_, v)| v);
                loaded.group = Some(GroupRead::Aggregate(agg.unwrap_or_default()));
            } else {
                check_versions(&loaded, keys.schema).map_err(|e| corrupt(keys, &e))?;
                loaded.group = Some(GroupRead::Full(pairs));
            }
        }
        Ok(loaded)
    }
}

/// Parses a `GROUP_LOAD` reply that took the mutex.
fn parse_group_loaded(reply: &[Value], keys: &SectionKeys) -> Result<Loaded, StoreError> {
    let live = flat(reply.get(9));
    let fields = Fields {
        revision: &text(reply, 3)?,
        liveness_revision: &text(reply, 4)?,
        schema: &text(reply, 5)?,
        layout: &text(reply, 6)?,
        run_id: &text(reply, 10)?,
        updated_at: "",
    };
    let mut loaded = fields.parse(keys, &text(reply, 1)?, &text(reply, 2)?, &live)?;
    let data = flat(reply.get(8));
    loaded.group = match text(reply, 7)?.as_str() {
        "" => None,
        "hit" => {
            loaded.cache_hit = true;
            Some(GroupRead::Hit)
        }
        "aggregate" => Some(GroupRead::Aggregate(bytes(data.first())?.unwrap_or_default())),
        "full" => Some(GroupRead::Full(pairs_from(&data)?)),
        "delta" => {
            let mut out = Vec::with_capacity(data.len() / 2);
            for pair in data.chunks(2) {
                let name = value_text(&pair[0])?;
                out.push((name, bytes(pair.get(1))?));
            }
            Some(GroupRead::Delta(DeltaRead {
                fields: out,
                shape: text(reply, 13)?,
            }))
        }
        other => return Err(StoreError::Protocol(format!("GROUP_LOAD answered kind {other:?}"))),
    };
    loaded.run_id = text(reply, 11)?;
    loaded.liveness_missing = int(reply, 12)? == 0;
    Ok(loaded)
}

fn flat(v: Option<&Value>) -> Vec<Value> {
    match v {
        Some(Value::Array(items)) => items.clone(),
        Some(Value::Map(items)) => items.iter().flat_map(|(k, v)| [k.clone(), v.clone()]).collect(),
        _ => Vec::new(),
    }
}

fn bytes(v: Option<&Value>) -> Result<Option<Vec<u8>>, StoreError> {
    match v {
        Some(Value::BulkString(b)) => Ok(Some(b.clone())),
        Some(Value::Nil) | None => Ok(None),
        Some(other) => Err(StoreError::Protocol(format!("expected a field value, got {other:?}"))),
    }
}

fn pairs_from(items: &[Value]) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let mut out = Vec::with_capacity(items.len() / 2);
    for pair in items.chunks(2) {
        let (Some(k), v) = (pair.first(), pair.get(1)) else {
            continue;
        };
        out.push((value_text(k)?, bytes(v)?.unwrap_or_default()));
    }
    Ok(out)
}

fn pairs_of(v: Option<&Value>) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    pairs_from(&flat(v))
}
