//! Parsing of the stream command replies the shard reader uses (`XREADGROUP`, `XAUTOCLAIM`, `XCLAIM`,
//! `XPENDING`), from raw [`redis::Value`]s.
//!
//! Parsed by hand rather than through redis-rs's typed stream replies because those keep fields in a `HashMap`
//! (the order of fields is lost, and a handler may care) and drop the difference between a deleted entry and an
//! empty one. No I/O here; accepts both RESP2 arrays and RESP3 maps.
//!
//! The reader's own `XREADGROUP` replies (every record passes through them) are decoded straight from their RESP2
//! bytes by [`read_group_frame`], without a [`Value`] tree; the property tests check that both readings agree.

use redis::Value;
use redis_link::resp::{Cursor, ProtocolError};

use crate::message::EntryId;

/// Fields of an entry, in order.
pub(crate) type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// One entry of a reply. `fields` is `None` for an entry still pending but deleted from the stream (trimmed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawEntry {
    pub id: EntryId,
    pub fields: Option<Fields>,
}

/// An `XAUTOCLAIM` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AutoClaim {
    /// Cursor for the next call; `0-0` when the scan is complete.
    pub next: String,
    /// Claimed entries, in id order.
    pub entries: Vec<RawEntry>,
    /// Pending ids whose entries no longer exist (Redis removed them from the pending list).
    pub deleted: Vec<EntryId>,
}

/// One row of an extended `XPENDING` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingRow {
    pub id: EntryId,
    pub consumer: String,
    pub delivery_count: u32,
}

/// A reply that does not have the expected shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected {command} reply: {detail}")]
pub(crate) struct ReplyError {
    pub command: &'static str,
    pub detail: String,
}

fn err(command: &'static str, detail: impl Into<String>) -> ReplyError {
    ReplyError {
        command,
        detail: detail.into(),
    }
}

fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.clone().into_bytes()),
        Value::Okay => Some(b"OK".to_vec()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

/// Like [`bytes`], moving the buffer out instead of copying it (replies are parsed once; the read loop is hot).
fn into_bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.into_bytes()),
        other => bytes(&other),
    }
}

/// The items of an array or set, or the value back (for the error message) when it is neither.
fn into_items(v: Value) -> Result<Vec<Value>, Value> {
    match v {
        Value::Array(items) | Value::Set(items) => Ok(items),
        other => Err(other),
    }
}

fn text(v: &Value) -> Option<String> {
    bytes(v).and_then(|b| String::from_utf8(b).ok())
}

fn entry_id(command: &'static str, v: &Value) -> Result<EntryId, ReplyError> {
    let raw: &[u8] = match v {
        Value::BulkString(b) => b,
        Value::SimpleString(s) => s.as_bytes(),
        Value::VerbatimString { text, .. } => text.as_bytes(),
        other => return Err(err(command, format!("entry id is {other:?}"))),
    };
    EntryId::from_bytes(raw).ok_or_else(|| bad_id(command, raw))
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => text(other)?.parse().ok(),
    }
}

fn items(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(items) | Value::Set(items) => Some(items),
        _ => None,
    }
}

fn fields(command: &'static str, v: Value) -> Result<Option<Fields>, ReplyError> {
    let pair = |k: Value, v: Value| -> Result<(Vec<u8>, Vec<u8>), ReplyError> {
        Ok((
            into_bytes(k).ok_or_else(|| err(command, "field"))?,
            into_bytes(v).ok_or_else(|| err(command, "value"))?,
        ))
    };
    match v {
        Value::Nil => Ok(None),
        Value::Map(pairs) => pairs
            .into_iter()
            .map(|(k, v)| pair(k, v))
            .collect::<Result<_, _>>()
            .map(Some),
        other => {
            let flat = into_items(other).map_err(|o| err(command, format!("fields are {o:?}")))?;
            if flat.len() % 2 != 0 {
                return Err(err(command, "odd number of field items"));
            }
            let mut out = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push(pair(k, v)?);
            }
            Ok(Some(out))
        }
    }
}

/// A list of `[id, fields]` pairs (the body of `XRANGE`, `XCLAIM`, and of one stream in `XREADGROUP`).
pub(crate) fn entries(command: &'static str, v: Value) -> Result<Vec<RawEntry>, ReplyError> {
    let list = match v {
        Value::Nil => return Ok(Vec::new()),
        other => into_items(other).map_err(|o| err(command, format!("entry list is {o:?}")))?,
    };
    // A plain loop into a vector of the list's length: collecting through `filter_map` reused the list's
    // allocation and then shrank it (a reallocation per read, measurable in the read loop).
    let mut out = Vec::with_capacity(list.len());
    for e in list {
        match e {
            // XCLAIM of an entry deleted meanwhile answers nil in its place (older servers).
            Value::Nil => {}
            other => {
                let pair = into_items(other).map_err(|o| err(command, format!("entry is {o:?}")))?;
                let mut it = pair.into_iter();
                let entry = match (it.next(), it.next(), it.next()) {
                    (Some(id), Some(f), None) => RawEntry {
                        id: entry_id(command, &id)?,
                        fields: fields(command, f)?,
                    },
                    (Some(id), None, None) => RawEntry {
                        id: entry_id(command, &id)?,
                        fields: None,
                    },
                    _ => return Err(err(command, "entry is not [id, fields]")),
                };
                out.push(entry);
            }
        }
    }
    Ok(out)
}

/// An `XREADGROUP` reply for one stream: nil on timeout, else `[[key, entries]]` (or a RESP3 map). The reference
/// reading of a [`Value`], which [`read_group_frame`] must agree with (the reader uses that one).
#[cfg(test)]
pub(crate) fn read_group(v: Value) -> Result<Vec<RawEntry>, ReplyError> {
    const CMD: &str = "XREADGROUP";
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::Map(pairs) => {
            let mut it = pairs.into_iter();
            match (it.next(), it.next()) {
                (None, _) => Ok(Vec::new()),
                (Some((_, list)), None) => entries(CMD, list),
                _ => Err(err(CMD, "more than one stream")),
            }
        }
        other => {
            let streams = into_items(other).map_err(|o| err(CMD, format!("{o:?}")))?;
            let mut it = streams.into_iter();
            match (it.next(), it.next()) {
                (None, _) => Ok(Vec::new()),
                (Some(one), None) => {
                    let mut parts = into_items(one)
                        .map_err(|_| err(CMD, "stream is not [key, entries]"))?
                        .into_iter();
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(_), Some(list), None) => entries(CMD, list),
                        _ => Err(err(CMD, "stream is not [key, entries]")),
                    }
                }
                _ => Err(err(CMD, "more than one stream")),
            }
        }
    }
}

/// An `XREADGROUP` reply for one stream, from the bytes of a RESP2 reply (not an error reply: the caller turns
/// one of those into its error first): the same reading as [`read_group`] without building [`Value`]s.
pub(crate) fn read_group_frame(frame: &[u8]) -> Result<Vec<RawEntry>, ReplyError> {
    let mut c = Cursor::new(frame);
    let entries = match c.array().map_err(malformed)? {
        None | Some(0) => Vec::new(),
        Some(1) => {
            if c.array().map_err(malformed)? != Some(2) {
                return Err(err(READ, "stream is not [key, entries]"));
            }
            c.skip().map_err(malformed)?;
            frame_entries(&mut c)?
        }
        Some(_) => return Err(err(READ, "more than one stream")),
    };
    if !c.is_done() {
        return Err(err(READ, "bytes after the reply"));
    }
    Ok(entries)
}

const READ: &str = "XREADGROUP";

fn malformed(e: ProtocolError) -> ReplyError {
    err(READ, e.to_string())
}

/// The entry list at the cursor (as [`entries`] reads it).
fn frame_entries(c: &mut Cursor<'_>) -> Result<Vec<RawEntry>, ReplyError> {
    let Some(n) = c.array().map_err(malformed)? else {
        return Ok(Vec::new());
    };
    // Bounded: the count is the server's word; entries must actually arrive to be kept.
    let mut out = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        let parts = match c.array().map_err(malformed)? {
            // A nil in place of an entry (as older servers answer XCLAIM).
            None => continue,
            Some(parts @ (1 | 2)) => parts,
            Some(_) => return Err(err(READ, "entry is not [id, fields]")),
        };
        let raw = c
            .bulk()
            .map_err(malformed)?
            .ok_or_else(|| err(READ, "entry id is nil"))?;
        let id = EntryId::from_bytes(raw).ok_or_else(|| bad_id(READ, raw))?;
        let fields = if parts == 2 { frame_fields(c)? } else { None };
        out.push(RawEntry { id, fields });
    }
    Ok(out)
}

fn frame_fields(c: &mut Cursor<'_>) -> Result<Option<Fields>, ReplyError> {
    let Some(flat) = c.array().map_err(malformed)? else {
        return Ok(None);
    };
    if flat % 2 != 0 {
        return Err(err(READ, "odd number of field items"));
    }
    let mut out = Vec::with_capacity((flat / 2).min(4096));
    for _ in 0..flat / 2 {
        let name = c.bulk().map_err(malformed)?.ok_or_else(|| err(READ, "field"))?;
        let value = c.bulk().map_err(malformed)?.ok_or_else(|| err(READ, "value"))?;
        out.push((name.to_vec(), value.to_vec()));
    }
    Ok(Some(out))
}

fn bad_id(command: &'static str, raw: &[u8]) -> ReplyError {
    let shown = String::from_utf8_lossy(&raw[..raw.len().min(48)]);
    err(command, format!("{shown:?} is not a stream entry id (<ms>-<seq>)"))
}

/// An `XAUTOCLAIM` reply: `[next, entries, deleted]` (Redis 7) or `[next, entries]` (6.2).
pub(crate) fn auto_claim(v: Value) -> Result<AutoClaim, ReplyError> {
    const CMD: &str = "XAUTOCLAIM";
    let mut parts = into_items(v).map_err(|o| err(CMD, format!("{o:?}")))?.into_iter();
    let (next, list, deleted) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(next), Some(list), deleted, None) => (next, list, deleted),
        _ => return Err(err(CMD, "not [next, entries, deleted]")),
    };
    let deleted = match deleted {
        None | Some(Value::Nil) => Vec::new(),
        Some(d) => items(&d)
            .ok_or_else(|| err(CMD, "deleted ids"))?
            .iter()
            .map(|id| entry_id(CMD, id))
            .collect::<Result<_, _>>()?,
    };
    Ok(AutoClaim {
        next: text(&next).ok_or_else(|| err(CMD, "cursor"))?,
        entries: entries(CMD, list)?,
        deleted,
    })
}

/// An extended `XPENDING key group start end count [consumer]` reply: `[[id, consumer, idle, deliveries]]`.
pub(crate) fn pending_rows(v: &Value) -> Result<Vec<PendingRow>, ReplyError> {
    const CMD: &str = "XPENDING";
    let rows = match v {
        Value::Nil => return Ok(Vec::new()),
        other => items(other).ok_or_else(|| err(CMD, format!("{other:?}")))?,
    };
    rows.iter()
        .map(|row| match items(row) {
            Some([id, consumer, _idle, count]) => Ok(PendingRow {
                id: entry_id(CMD, id)?,
                consumer: text(consumer).ok_or_else(|| err(CMD, "consumer"))?,
                delivery_count: int(count)
                    .and_then(|c| u32::try_from(c).ok())
                    .ok_or_else(|| err(CMD, "delivery count"))?,
            }),
            _ => Err(err(CMD, "row is not [id, consumer, idle, deliveries]")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn arr(v: Vec<Value>) -> Value {
        Value::Array(v)
    }

    fn id(ms: u64, seq: u64) -> EntryId {
        EntryId { ms, seq }
    }

    #[test]
    fn read_group_timeout_is_empty() {
        assert_eq!(read_group(Value::Nil).unwrap(), vec![]);
    }

    #[test]
    fn read_group_keeps_field_order() {
        let v = arr(vec![arr(vec![
            b("key"),
            arr(vec![
                arr(vec![b("1-0"), arr(vec![b("z"), b("1"), b("a"), b("2")])]),
                arr(vec![b("1-1"), arr(vec![b("k"), b("v")])]),
            ]),
        ])]);
        let e = read_group(v.clone()).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].id, id(1, 0));
        assert_eq!(
            e[0].fields,
            Some(vec![(b"z".to_vec(), b"1".to_vec()), (b"a".to_vec(), b"2".to_vec())])
        );
    }

    #[test]
    fn read_group_resp3_map() {
        let v = Value::Map(vec![(
            b("key"),
            arr(vec![arr(vec![b("5-0"), arr(vec![b("k"), b("v")])])]),
        )]);
        assert_eq!(read_group(v.clone()).unwrap()[0].id, id(5, 0));
    }

    #[test]
    fn auto_claim_with_deleted_entries() {
        let v = arr(vec![
            b("7-0"),
            arr(vec![
                arr(vec![b("3-0"), arr(vec![b("k"), b("v")])]),
                arr(vec![b("4-0"), Value::Nil]),
            ]),
            arr(vec![b("2-0")]),
        ]);
        let c = auto_claim(v.clone()).unwrap();
        assert_eq!(c.next, "7-0");
        assert_eq!(c.entries.len(), 2);
        assert_eq!(c.entries[1].fields, None, "nil fields: deleted");
        assert_eq!(c.deleted, vec![id(2, 0)]);
    }

    #[test]
    fn auto_claim_redis_6_shape() {
        let c = auto_claim(arr(vec![b("0-0"), arr(vec![])])).unwrap();
        assert_eq!(c.next, "0-0");
        assert!(c.entries.is_empty() && c.deleted.is_empty());
    }

    #[test]
    fn pending_rows_parse() {
        let v = arr(vec![arr(vec![b("1-0"), b("m1"), Value::Int(10), Value::Int(3)])]);
        assert_eq!(
            pending_rows(&v).unwrap(),
            vec![PendingRow {
                id: id(1, 0),
                consumer: "m1".into(),
                delivery_count: 3
            }]
        );
    }

    #[test]
    fn entry_id_replies_are_read_strictly() {
        assert_eq!(entry_id("X", &b("1700000000123-42")), Ok(id(1_700_000_000_123, 42)));
        assert!(entry_id("X", &b("1-0x")).is_err());
        assert!(entry_id("X", &Value::Int(1)).is_err(), "an integer is not an id");
        assert_eq!(entry_id("X", &Value::SimpleString("2-3".into())), Ok(id(2, 3)));
    }

    /// One generated entry: id, then nil (deleted), no fields part, or fields.
    type GenEntry = (u64, u64, Option<Option<Vec<(Vec<u8>, Vec<u8>)>>>);

    fn bulk(out: &mut Vec<u8>, b: &[u8]) {
        redis_link::resp::write_arg(out, b);
    }

    /// The RESP2 bytes Redis sends for an `XREADGROUP` of one stream (`None` entries: a nil in the list).
    fn encode(entries: &[Option<GenEntry>]) -> Vec<u8> {
        let mut out = b"*1\r\n*2\r\n".to_vec();
        bulk(&mut out, b"{s}:0");
        out.extend_from_slice(format!("*{}\r\n", entries.len()).as_bytes());
        for e in entries {
            let Some((ms, seq, fields)) = e else {
                out.extend_from_slice(b"*-1\r\n");
                continue;
            };
            let id = format!("{ms}-{seq}");
            match fields {
                None => {
                    out.extend_from_slice(b"*1\r\n");
                    bulk(&mut out, id.as_bytes());
                }
                Some(fields) => {
                    out.extend_from_slice(b"*2\r\n");
                    bulk(&mut out, id.as_bytes());
                    match fields {
                        None => out.extend_from_slice(b"*-1\r\n"),
                        Some(pairs) => {
                            out.extend_from_slice(format!("*{}\r\n", pairs.len() * 2).as_bytes());
                            for (n, v) in pairs {
                                bulk(&mut out, n);
                                bulk(&mut out, v);
                            }
                        }
                    }
                }
            }
        }
        out
    }

    fn by_value(bytes: &[u8]) -> Result<Vec<RawEntry>, ReplyError> {
        let (value, used) = redis_link::resp::parse(bytes).unwrap().expect("complete");
        assert_eq!(used, bytes.len());
        read_group(value)
    }

    proptest::proptest! {
        /// The reader's decoding of the reply's bytes and the reading of its parsed `Value` agree on every reply
        /// Redis can send, and on damaged ones the direct decoding fails without panicking.
        #[test]
        fn reading_the_bytes_agrees_with_reading_the_value(
            entries in proptest::collection::vec(
                proptest::option::weighted(0.9, (
                    0u64..u64::MAX,
                    0u64..5,
                    proptest::option::weighted(0.9, proptest::option::weighted(0.9, proptest::collection::vec(
                        (proptest::collection::vec(proptest::num::u8::ANY, 0..6),
                         proptest::collection::vec(proptest::num::u8::ANY, 0..40)),
                        0..4,
                    ))),
                )),
                0..20,
            ),
            cut in proptest::num::usize::ANY,
            flip in proptest::num::usize::ANY,
        ) {
            let bytes = encode(&entries);
            let direct = read_group_frame(&bytes);
            proptest::prop_assert_eq!(&direct, &by_value(&bytes));
            let expected: Vec<EntryId> = entries.iter().flatten().map(|(ms, seq, _)| id(*ms, *seq)).collect();
            proptest::prop_assert_eq!(direct.unwrap().iter().map(|e| e.id).collect::<Vec<_>>(), expected);
            let _ = read_group_frame(&bytes[..cut % bytes.len()]);
            let mut damaged = bytes.clone();
            let at = flip % damaged.len();
            damaged[at] ^= 0x5a;
            let _ = read_group_frame(&damaged);
        }
    }

    #[test]
    fn the_timeout_and_odd_replies_read_the_same_both_ways() {
        for bytes in [&b"*-1\r\n"[..], b"*0\r\n", b"*1\r\n*2\r\n$1\r\nk\r\n*-1\r\n"] {
            assert_eq!(read_group_frame(bytes), by_value(bytes), "{bytes:?}");
            assert_eq!(read_group_frame(bytes), Ok(vec![]));
        }
        for bytes in [
            &b"*2\r\n*2\r\n$1\r\nk\r\n*0\r\n*2\r\n$1\r\nj\r\n*0\r\n"[..],
            b"*1\r\n*3\r\n$1\r\nk\r\n*0\r\n*0\r\n",
            b"*1\r\n*2\r\n$1\r\nk\r\n*1\r\n*2\r\n$4\r\nnope\r\n*0\r\n",
            b"*1\r\n*2\r\n$1\r\nk\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*1\r\n$1\r\nf\r\n",
            b"*1\r\n*2\r\n$1\r\nk\r\n*1\r\n*3\r\n$3\r\n1-0\r\n*0\r\n*0\r\n",
            b":1\r\n",
        ] {
            assert!(read_group_frame(bytes).is_err(), "{bytes:?}");
            assert!(by_value(bytes).is_err(), "{bytes:?}");
        }
        assert!(read_group_frame(b"*0\r\n:1\r\n").is_err(), "bytes after the reply");
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        assert!(read_group(Value::Int(1)).is_err());
        assert!(auto_claim(arr(vec![b("0-0")])).is_err());
        assert!(entries("X", arr(vec![arr(vec![b("1-0"), arr(vec![b("odd")])])])).is_err());
        assert!(entries("X", arr(vec![arr(vec![b("nope"), arr(vec![])])])).is_err());
        assert!(pending_rows(&arr(vec![arr(vec![b("1-0")])])).is_err());
    }
}
