//! The publish script's tests: its arguments, and its answers from a real Redis.

use super::*;

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

fn id(s: &str) -> EntryId {
    s.parse().unwrap()
}

#[test]
fn replies_are_read_and_checked_against_the_record_count() {
    let written = Value::Array(vec![bulk("WRITTEN"), Value::Array(vec![bulk("1-0"), bulk("1-1")])]);
    assert_eq!(
        parse_reply(written.clone(), 2),
        Some(ScriptReply::Written(vec![id("1-0"), id("1-1")]))
    );
    assert_eq!(parse_reply(written, 3), None, "a count mismatch is not an answer");
    assert_eq!(
        parse_reply(Value::Array(vec![bulk("DUPLICATE"), bulk("1-0 1-1")]), 2),
        Some(ScriptReply::Duplicate(vec![id("1-0"), id("1-1")]))
    );
    assert_eq!(
        parse_reply(Value::Array(vec![bulk("FENCED"), bulk("7")]), 2),
        Some(ScriptReply::Fenced(RoutingVersion(7)))
    );
    assert_eq!(
        parse_reply(Value::Array(vec![bulk("OUT_OF_ORDER"), bulk("12")]), 2),
        Some(ScriptReply::OutOfOrder { expected: 12 })
    );
    assert_eq!(parse_reply(Value::Array(vec![bulk("NOPE")]), 2), None);
    assert_eq!(parse_reply(bulk("1-0"), 1), None);
}

#[test]
fn ids_are_read_as_a_list_or_as_one_run() {
    assert_eq!(expand_ids("5-9+3", 3), Some(vec![id("5-9"), id("5-10"), id("5-11")]));
    assert_eq!(expand_ids("1-0 1-1", 2), Some(vec![id("1-0"), id("1-1")]));
    assert_eq!(expand_ids("5-9+3", 4), None, "a run of another length");
    assert_eq!(expand_ids("1-0 1-1", 3), None, "a list of another length");
    for bad in ["5+3", "x-1+3", "5-y+3", "5-1+z", "5-18446744073709551615+2"] {
        assert_eq!(expand_ids(bad, 3.min(bad.len())), None, "{bad}");
    }
    let written = Value::Array(vec![bulk("WRITTEN"), bulk("7-0+2")]);
    assert_eq!(
        parse_reply(written, 2),
        Some(ScriptReply::Written(vec![id("7-0"), id("7-1")]))
    );
}

#[test]
fn a_call_names_only_keys_of_the_shard_slot() {
    let script = PublishScript::default();
    let stream = StreamName::new("orders").unwrap();
    let records = [Record::with_key("k").field("f", "v")];
    for sequence in [
        None,
        Some(Sequence {
            producer_id: "p",
            epoch: "e",
            first: 0,
            gap: false,
            idle_ms: 1000,
        }),
    ] {
        let mut pipe = redis::pipe();
        script.add_call(
            &mut pipe,
            &stream,
            Call {
                shard: ShardId(3),
                presented: Presented::unchecked(RoutingVersion(2)),
                trim: ScriptTrim::MaxLen(10),
                sequence,
            },
            records.iter(),
        );
        let packed = String::from_utf8_lossy(&pipe.get_packed_pipeline()).to_string();
        let words: Vec<&str> = packed.split("\r\n").filter(|w| !w.starts_with(['$', '*'])).collect();
        assert_eq!(words[0], "EVALSHA");
        assert_eq!(words[2], "3");
        let tag = keys::hash_tag(words[3]);
        assert_eq!(tag, keys::shard_tag(&stream, ShardId(3)));
        assert!(words[4..6].iter().all(|k| keys::hash_tag(k) == tag), "{words:?}");
    }
}

/// Runs the script against a real Redis (as the producer sends it) and reads its answer.
struct Shard {
    con: redis::aio::MultiplexedConnection,
    stream: StreamName,
    script: PublishScript,
}

impl Shard {
    async fn new(redis: &test_support::RedisServer) -> Shard {
        let mut con = redis.connection().await;
        let () = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(PublishScript::source())
            .query_async::<String>(&mut con)
            .await
            .map(drop)
            .unwrap();
        Shard {
            con,
            stream: StreamName::new("orders").unwrap(),
            script: PublishScript::default(),
        }
    }

    async fn call(&mut self, version: u64, seq: Option<(&str, u64, bool)>, n: usize) -> Option<ScriptReply> {
        self.call_as(Presented::unchecked(RoutingVersion(version)), seq, n)
            .await
    }

    async fn call_as(&mut self, presented: Presented, seq: Option<(&str, u64, bool)>, n: usize) -> Option<ScriptReply> {
        let records: Vec<Record> = (0..n)
            .map(|i| Record::with_key("k").field("n", i.to_string()))
            .collect();
        let mut pipe = redis::pipe();
        self.script.add_call(
            &mut pipe,
            &self.stream,
            Call {
                shard: ShardId(0),
                presented,
                trim: ScriptTrim::None,
                sequence: seq.map(|(epoch, first, gap)| Sequence {
                    producer_id: "p",
                    epoch,
                    first,
                    gap,
                    idle_ms: 60_000,
                }),
            },
            records.iter(),
        );
        let mut replies: Vec<Value> = pipe.query_async(&mut self.con).await.unwrap();
        parse_reply(replies.pop().unwrap(), n)
    }

    async fn len(&mut self) -> u64 {
        redis::cmd("XLEN")
            .arg(keys::shard_stream(&self.stream, ShardId(0)))
            .query_async(&mut self.con)
            .await
            .unwrap()
    }

    async fn born(&mut self, version: u64) {
        let () = redis::cmd("HSET")
            .arg(keys::shard_fence(&self.stream, ShardId(0)))
            .arg(keys::shard_fence_fields::BORN_VERSION)
            .arg(version)
            .query_async::<u64>(&mut self.con)
            .await
            .map(drop)
            .unwrap();
    }

    async fn fence(&mut self, version: u64) {
        self.set(keys::shard_fence_fields::ROUTING_VERSION, &version.to_string())
            .await;
    }

    async fn set(&mut self, field: &str, value: &str) {
        let () = redis::cmd("HSET")
            .arg(keys::shard_fence(&self.stream, ShardId(0)))
            .arg(field)
            .arg(value)
            .query_async::<u64>(&mut self.con)
            .await
            .map(drop)
            .unwrap();
    }
}

fn ids(reply: Option<ScriptReply>) -> Vec<EntryId> {
    match reply {
        Some(ScriptReply::Written(ids)) => ids,
        other => panic!("expected Written, got {other:?}"),
    }
}

#[tokio::test]
async fn a_fenced_call_writes_nothing_and_a_current_one_writes_everything() {
    let redis = test_support::RedisServer::start().await;
    let mut shard = Shard::new(&redis).await;
    assert_eq!(ids(shard.call(1, None, 3).await).len(), 3, "no fence: version 1 writes");
    shard.fence(2).await;
    assert_eq!(
        shard.call(1, None, 3).await,
        Some(ScriptReply::Fenced(RoutingVersion(2)))
    );
    assert_eq!(shard.len().await, 3, "the fenced call wrote nothing");
    assert_eq!(
        ids(shard.call(2, None, 2).await).len(),
        2,
        "the fence version itself may write"
    );
    assert_eq!(ids(shard.call(3, None, 1).await).len(), 1);
    assert_eq!(shard.len().await, 6);
}

/// Issue 30: where the routing promises shard records, a shard without one (a growth Redis lost) or born at a
/// later version (a version number that meant another layout) takes nothing; the refusal names a version the
/// producer must reach, above its own. Without the promise (a stream not migrated yet) only the fence counts.
#[tokio::test]
async fn with_records_promised_only_a_shard_born_at_the_producers_routing_takes_the_write() {
    let redis = test_support::RedisServer::start().await;
    let mut shard = Shard::new(&redis).await;
    let checked = |v: u64| Presented {
        version: RoutingVersion(v),
        records: true,
        count: 4,
    };
    assert_eq!(
        shard.call_as(checked(4), None, 2).await,
        Some(ScriptReply::Fenced(RoutingVersion(5))),
        "no record: the shard does not exist at any routing Redis knows"
    );
    assert_eq!(ids(shard.call(4, None, 1).await).len(), 1, "not promised: not checked");
    shard.born(6).await;
    assert_eq!(
        shard.call_as(checked(4), None, 2).await,
        Some(ScriptReply::Fenced(RoutingVersion(6)))
    );
    assert_eq!(shard.len().await, 1, "the refused calls wrote nothing");
    assert_eq!(ids(shard.call_as(checked(6), None, 2).await).len(), 2);
    assert_eq!(ids(shard.call_as(checked(9), None, 1).await).len(), 1);
    // The fence comes first.
    shard.fence(10).await;
    assert_eq!(
        shard.call_as(checked(9), None, 1).await,
        Some(ScriptReply::Fenced(RoutingVersion(10)))
    );
    // The idempotence check comes before both: a retry of a written batch is still recognised.
    let first = shard.call_as(checked(10), Some(("e", 0, false)), 2).await;
    assert_eq!(ids(first).len(), 2);
    assert!(matches!(
        shard.call_as(checked(10), Some(("e", 0, false)), 2).await,
        Some(ScriptReply::Duplicate(_))
    ));
    assert_eq!(shard.len().await, 6);
}

/// Issue 30: a record whose fence or birth names a layout with more shards than the producer's refuses it
/// (a version issued again after a restore, or a lost history's higher number), as `crate::fence` says; a
/// count the script cannot read fails the call closed.
#[tokio::test]
async fn a_layout_with_fewer_shards_than_the_record_names_takes_nothing() {
    let redis = test_support::RedisServer::start().await;
    let mut shard = Shard::new(&redis).await;
    let with = |v: u64, count: u32| Presented {
        version: RoutingVersion(v),
        records: true,
        count,
    };
    shard.born(1).await;
    shard.fence(2).await;
    shard.set(keys::shard_fence_fields::FENCE_COUNT, "8").await;
    assert_eq!(
        shard.call_as(with(2, 4), None, 1).await,
        Some(ScriptReply::Fenced(RoutingVersion(3))),
        "v2 of 4 shards against a fence for v2 of 8"
    );
    assert_eq!(
        shard.call_as(with(9, 4), None, 1).await,
        Some(ScriptReply::Fenced(RoutingVersion(10)))
    );
    assert_eq!(ids(shard.call_as(with(2, 8), None, 1).await).len(), 1);
    assert_eq!(ids(shard.call(2, None, 1).await).len(), 1, "not promised: not checked");
    shard.set(keys::shard_fence_fields::BORN_COUNT, "12").await;
    assert_eq!(
        shard.call_as(with(2, 8), None, 1).await,
        Some(ScriptReply::Fenced(RoutingVersion(3))),
        "born into 12 shards"
    );
    assert_eq!(ids(shard.call_as(with(2, 12), None, 1).await).len(), 1);
    assert_eq!(shard.len().await, 3, "the refused calls wrote nothing");
    shard.set(keys::shard_fence_fields::BORN_COUNT, "many").await;
    let mut pipe = redis::pipe();
    let records = [Record::with_key("k").field("n", "x")];
    shard.script.add_call(
        &mut pipe,
        &shard.stream,
        Call {
            shard: ShardId(0),
            presented: with(2, 12),
            trim: ScriptTrim::None,
            sequence: None,
        },
        records.iter(),
    );
    let err = pipe
        .query_async::<Vec<Value>>(&mut shard.con)
        .await
        .expect_err("a corrupt count fails the call");
    assert!(err.to_string().contains("non-number count"), "{err}");
    assert_eq!(shard.len().await, 3);
}

#[tokio::test]
async fn a_malformed_layout_is_refused_before_anything_is_written() {
    let redis = test_support::RedisServer::start().await;
    let mut shard = Shard::new(&redis).await;
    let stream_key = keys::shard_stream(&shard.stream, ShardId(0));
    let fence_key = keys::shard_fence(&shard.stream, ShardId(0));
    let seq_key = keys::producer_sequence(&shard.stream, ShardId(0), "-");
    // (record count, fields per record or 0, then the record arguments)
    let cases: [(&str, &str, &[&str], &str); 4] = [
        ("2", "1", &["f", "v"], "malformed arguments"),
        ("1", "-1", &["f", "v"], "malformed header"),
        ("1", "x", &["f", "v"], "malformed header"),
        ("2", "0", &["1", "f", "v", "0"], "malformed record 2"),
    ];
    for (count, uniform, fields, why) in cases {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(shard.script.script.get_hash())
            .arg(3)
            .arg(&stream_key)
            .arg(&fence_key)
            .arg(&seq_key)
            .arg(1)
            .arg("")
            .arg("")
            .arg("")
            .arg("")
            .arg("0")
            .arg(0)
            .arg(count)
            .arg(uniform)
            .arg("0")
            .arg(fields);
        let err = cmd.query_async::<Value>(&mut shard.con).await.unwrap_err();
        assert!(err.to_string().contains(why), "{count}/{uniform}: {err}");
    }
    assert_eq!(shard.len().await, 0, "nothing written by a refused call");
}

#[tokio::test]
async fn an_unreadable_fence_refuses_the_call() {
    let redis = test_support::RedisServer::start().await;
    let mut shard = Shard::new(&redis).await;
    let () = redis::cmd("HSET")
        .arg(keys::shard_fence(&shard.stream, ShardId(0)))
        .arg(keys::shard_fence_fields::ROUTING_VERSION)
        .arg("seven")
        .query_async::<u64>(&mut shard.con)
        .await
        .map(drop)
        .unwrap();
    let mut pipe = redis::pipe();
    let records = [Record::with_key("k").field("f", "v")];
    shard.script.add_call(
        &mut pipe,
        &shard.stream,
        Call {
            shard: ShardId(0),
            presented: Presented::unchecked(RoutingVersion(9)),
            trim: ScriptTrim::None,
            sequence: None,
        },
        records.iter(),
    );
    let err = pipe.query_async::<Vec<Value>>(&mut shard.con).await.unwrap_err();
    assert!(err.to_string().contains("CORRUPT"), "{err}");
    assert_eq!(shard.len().await, 0);
}

#[tokio::test]
async fn sequences_deduplicate_the_last_call_and_refuse_gaps() {
    let redis = test_support::RedisServer::start().await;
    let mut shard = Shard::new(&redis).await;
    let first = ids(shard.call(1, Some(("e1", 0, false)), 3).await);
    assert_eq!(
        shard.call(1, Some(("e1", 0, false)), 3).await,
        Some(ScriptReply::Duplicate(first.clone())),
        "a retry answers the original ids"
    );
    assert_eq!(shard.len().await, 3, "and writes nothing");
    // A gap (sequence 5 while 3 is next) is refused unless the call says one is expected.
    assert_eq!(
        shard.call(1, Some(("e1", 5, false)), 2).await,
        Some(ScriptReply::OutOfOrder { expected: 3 })
    );
    assert_eq!(shard.len().await, 3);
    let second = ids(shard.call(1, Some(("e1", 3, false)), 2).await);
    assert_eq!(
        ids(shard.call(1, Some(("e1", 7, true)), 1).await).len(),
        1,
        "an expected gap"
    );
    // Only the last call is remembered: the one before it is out of the window.
    assert_eq!(
        shard.call(1, Some(("e1", 3, false)), 2).await,
        Some(ScriptReply::OutOfWindow { next: 8 })
    );
    assert_eq!(shard.len().await, 6);
    assert_ne!(first, second);
    // A new instance (another epoch) with the same producer id starts its own sequence at 0.
    assert_eq!(ids(shard.call(1, Some(("e2", 0, false)), 1).await).len(), 1);
    assert_eq!(shard.len().await, 7);
}

#[tokio::test]
async fn a_retry_after_the_seal_is_still_recognised_as_written() {
    let redis = test_support::RedisServer::start().await;
    let mut shard = Shard::new(&redis).await;
    let written = ids(shard.call(1, Some(("e", 0, false)), 2).await);
    shard.fence(2).await;
    assert_eq!(
        shard.call(1, Some(("e", 0, false)), 2).await,
        Some(ScriptReply::Duplicate(written)),
        "not Fenced: the records are in the shard, re-routing them would duplicate them"
    );
    assert_eq!(
        shard.call(1, Some(("e", 2, false)), 1).await,
        Some(ScriptReply::Fenced(RoutingVersion(2)))
    );
}

#[tokio::test]
async fn the_sequence_state_is_bounded_and_expires() {
    let redis = test_support::RedisServer::start().await;
    let mut shard = Shard::new(&redis).await;
    for call in 0..20u64 {
        ids(shard.call(1, Some(("e", call * 10, false)), 10).await);
    }
    let key = keys::producer_sequence(&shard.stream, ShardId(0), "p");
    let fields: u64 = redis::cmd("HLEN").arg(&key).query_async(&mut shard.con).await.unwrap();
    assert_eq!(
        fields, 4,
        "epoch, next, first and the ids of the last call, however many calls"
    );
    let ids_len: u64 = redis::cmd("HSTRLEN")
        .arg(&key)
        .arg("ids")
        .query_async(&mut shard.con)
        .await
        .unwrap();
    assert!(ids_len < 10 * 40, "the ids of one call only ({ids_len} bytes)");
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut shard.con).await.unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "idle expiry set: {ttl}");
    // Not idempotent: no state at all.
    ids(shard.call(1, None, 1).await);
    let exists: u64 = redis::cmd("EXISTS")
        .arg(keys::producer_sequence(&shard.stream, ShardId(0), "-"))
        .query_async(&mut shard.con)
        .await
        .unwrap();
    assert_eq!(exists, 0);
}

#[tokio::test]
async fn one_field_records_with_trimming_are_written_and_trimmed() {
    let redis = test_support::RedisServer::start().await;
    let mut shard = Shard::new(&redis).await;
    let records: Vec<Record> = (0..300)
        .map(|i| Record::with_key("k").field("n", i.to_string()))
        .collect();
    let mut pipe = redis::pipe();
    shard.script.add_call(
        &mut pipe,
        &shard.stream,
        Call {
            shard: ShardId(0),
            presented: Presented::unchecked(RoutingVersion(1)),
            trim: ScriptTrim::MaxLen(100),
            sequence: None,
        },
        records.iter(),
    );
    let mut replies: Vec<Value> = pipe.query_async(&mut shard.con).await.unwrap();
    let written = ids(parse_reply(replies.pop().unwrap(), 300));
    assert_eq!(written.len(), 300);
    let len = shard.len().await;
    assert!((100..300).contains(&len), "approximate trimming kept {len} of 300");
    let last: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
        .arg(keys::shard_stream(&shard.stream, ShardId(0)))
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(&mut shard.con)
        .await
        .unwrap();
    assert_eq!(
        last[0].0,
        written[299].to_string(),
        "the answer's last id is the stream's last entry"
    );
    assert_eq!(last[0].1, vec![("n".to_owned(), "299".to_owned())]);
}

#[tokio::test]
async fn records_of_different_sizes_keep_exactly_their_fields_with_trimming() {
    let redis = test_support::RedisServer::start().await;
    let mut shard = Shard::new(&redis).await;
    let records = [
        Record::with_key("k").field("a", "1").field("b", "2").field("c", "3"),
        Record::with_key("k").field("d", "4"),
        Record::with_key("k").field("e", "").field("f", "6"),
    ];
    let mut pipe = redis::pipe();
    shard.script.add_call(
        &mut pipe,
        &shard.stream,
        Call {
            shard: ShardId(0),
            presented: Presented::unchecked(RoutingVersion(1)),
            trim: ScriptTrim::MaxLen(1000),
            sequence: None,
        },
        records.iter(),
    );
    let mut replies: Vec<Value> = pipe.query_async(&mut shard.con).await.unwrap();
    ids(parse_reply(replies.pop().unwrap(), 3));
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(keys::shard_stream(&shard.stream, ShardId(0)))
        .arg("-")
        .arg("+")
        .query_async(&mut shard.con)
        .await
        .unwrap();
    let fields: Vec<Vec<(String, String)>> = entries.into_iter().map(|(_, f)| f).collect();
    let pair = |n: &str, v: &str| (n.to_owned(), v.to_owned());
    assert_eq!(
        fields,
        vec![
            vec![pair("a", "1"), pair("b", "2"), pair("c", "3")],
            vec![pair("d", "4")],
            vec![pair("e", ""), pair("f", "6")],
        ]
    );
}
