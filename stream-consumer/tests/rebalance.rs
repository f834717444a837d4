//! Rebalancing against a real redis-server and the real coordinator (in-process): a member joins, a member is
//! killed, a member leaves gracefully; plus retries and dead-lettering of a failing entry.

mod common;

use common::*;
use protocol::keys;
use protocol::ShardId;
use std::time::{Duration, Instant};
use stream_consumer::{dead_letter, Message};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn second_member_join_moves_half_the_shards_with_no_shard_read_by_both() {
    let env = Env::start("join").await;
    let rec = Recorder::new();
    let producer = env.spawn_producer(Duration::from_millis(5));

    let a = env.consumer("a", &rec).build().unwrap().spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8 shards", |s| {
        s.reading.len() == 8
    })
    .await;

    let joined_at = Instant::now();
    let b = env.consumer("b", &rec).build().unwrap().spawn();
    wait_status(&b, Duration::from_secs(10), "b reads 4 shards", |s| {
        s.reading.len() == 4
    })
    .await;
    wait_status(&a, Duration::from_secs(10), "a reads 4 shards, nothing revoking", |s| {
        s.reading.len() == 4 && s.revoking.is_empty()
    })
    .await;
    let (a_shards, b_shards) = (shards(&a.status().reading), shards(&b.status().reading));
    assert!(
        a_shards.is_disjoint(&b_shards),
        "a {a_shards:?} and b {b_shards:?} overlap"
    );

    // Let b handle new entries on every shard it got.
    test_support::wait_until(
        Duration::from_secs(10),
        "b to handle entries on each of its shards",
        || {
            let read = rec.shards_read_after("b", joined_at);
            let done = b_shards.is_subset(&read);
            async move { done }
        },
    )
    .await;
    assert!(
        rec.shards_read_after("a", Instant::now() - Duration::from_millis(1))
            .is_disjoint(&b_shards),
        "a still reads b's shards"
    );

    let produced = producer.stop().await;
    wait_all_handled(&env, &rec, &produced).await;
    rec.assert_no_overlap();
    // After the handover, b's shards were handled only by b.
    let moved_late: Vec<_> = rec
        .of("a")
        .into_iter()
        .filter(|r| b_shards.contains(&r.shard) && r.start > rec.of("b").first().unwrap().start)
        .collect();
    assert!(
        moved_late.is_empty(),
        "a handled moved shards after b started: {moved_late:?}"
    );

    assert!(a.close().await.unwrap().left);
    assert!(b.close().await.unwrap().left);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_member_shards_move_only_after_its_lease_expires_and_pending_entries_are_redelivered() {
    let env = Env::start("kill").await;
    let rec = Recorder::new();
    let gate_a = Gate::open();
    let a = env.consumer_with("a", &rec, gate_a.clone()).build().unwrap().spawn();
    let b = env.consumer("b", &rec).build().unwrap().spawn();
    wait_status(&a, Duration::from_secs(10), "a reads 4 shards", |s| {
        s.reading.len() == 4 && s.revoking.is_empty()
    })
    .await;
    wait_status(&b, Duration::from_secs(10), "b reads 4 shards", |s| {
        s.reading.len() == 4 && s.revoking.is_empty()
    })
    .await;
    let a_shards = shards(&a.status().reading);

    // a takes one entry on each of its shards and hangs in the handler: they stay pending for a.
    gate_a.set(false);
    let mut stuck = Vec::new();
    for (n, &shard) in a_shards.iter().enumerate() {
        stuck.push(env.produce_one(shard, n as u64).await);
    }
    wait_status(
        &a,
        Duration::from_secs(10),
        "a holds an entry of every shard in flight",
        |s| s.in_flight.len() == 4,
    )
    .await;

    let killed_at = Instant::now();
    a.abort().await;

    // More entries for a's shards while nobody may read them.
    let mut later = Vec::new();
    for (n, &shard) in a_shards.iter().enumerate() {
        later.push(env.produce_one(shard, 100 + n as u64).await);
    }

    wait_status(&b, MEMBER_TTL * 5, "b reads all 8 shards", |s| s.reading.len() == 8).await;
    let first_b_on_a_shard = rec
        .of("b")
        .into_iter()
        .filter(|r| a_shards.contains(&r.shard))
        .map(|r| r.start)
        .min();
    // Wait for b's first read there if it has not happened yet.
    let first = match first_b_on_a_shard {
        Some(t) => t,
        None => {
            test_support::wait_for(Duration::from_secs(10), "b to handle one of a's shards", || {
                let t = rec
                    .of("b")
                    .into_iter()
                    .filter(|r| a_shards.contains(&r.shard))
                    .map(|r| r.start)
                    .min();
                async move { t }
            })
            .await
        }
    };
    // a's last heartbeat was sent at most one interval before the kill; the coordinator expires it a member TTL
    // after receiving it.
    let earliest = killed_at + MEMBER_TTL - HEARTBEAT - Duration::from_millis(50);
    assert!(
        first >= earliest,
        "b read a's shard {:?} after the kill, before a's member lease could expire ({:?})",
        first - killed_at,
        MEMBER_TTL
    );
    println!(
        "killed member's shards first read by the survivor {:?} after the kill",
        first - killed_at
    );

    // The entries a held are delivered again, to b, with a higher delivery count.
    let expected: std::collections::BTreeSet<_> = stuck.iter().chain(later.iter()).copied().collect();
    wait_all_handled(&env, &rec, &expected).await;
    for (shard, id) in &stuck {
        let redelivered = rec
            .of("b")
            .into_iter()
            .find(|r| r.shard == *shard && r.id == *id && r.ok)
            .expect("stuck entry redelivered to b");
        assert!(
            redelivered.delivery >= 2,
            "delivery count of a re-delivered entry: {}",
            redelivered.delivery
        );
    }
    rec.assert_no_overlap();
    assert!(b.close().await.unwrap().left);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_close_hands_shards_over_within_one_heartbeat_interval() {
    let env = Env::start("close").await;
    let rec = Recorder::new();
    let producer = env.spawn_producer(Duration::from_millis(5));
    let a = env.consumer("a", &rec).build().unwrap().spawn();
    let b = env.consumer("b", &rec).build().unwrap().spawn();
    wait_status(&a, Duration::from_secs(10), "a reads 4", |s| {
        s.reading.len() == 4 && s.revoking.is_empty()
    })
    .await;
    wait_status(&b, Duration::from_secs(10), "b reads 4", |s| {
        s.reading.len() == 4 && s.revoking.is_empty()
    })
    .await;
    let a_shards = shards(&a.status().reading);

    let close_started = Instant::now();
    let report = a.close().await.unwrap();
    let closed = Instant::now();
    assert!(report.left, "a left the group");
    assert!(
        report.killed_shards.is_empty(),
        "nothing was cut short: {:?}",
        report.killed_shards
    );
    wait_status(&b, Duration::from_secs(5), "b reads all 8", |s| s.reading.len() == 8).await;
    let taken_over = Instant::now();
    let first_read = test_support::wait_for(Duration::from_secs(5), "b to handle one of a's shards", || {
        let t = rec
            .of("b")
            .into_iter()
            .filter(|r| a_shards.contains(&r.shard) && r.start > close_started)
            .map(|r| r.start)
            .min();
        async move { t }
    })
    .await;
    println!(
        "graceful handover: close() took {:?}; b read all 8 shards {:?} after close returned ({:?} after close \
         started); b's first entry on a moved shard {:?} after close started",
        closed - close_started,
        taken_over - closed,
        taken_over - close_started,
        first_read - close_started,
    );
    assert!(
        taken_over - closed <= HEARTBEAT + Duration::from_millis(150),
        "shards handed over {:?} after the leave, more than one heartbeat interval ({HEARTBEAT:?})",
        taken_over - closed
    );

    let produced = producer.stop().await;
    wait_all_handled(&env, &rec, &produced).await;
    rec.assert_no_overlap();
    let desc = env.describe().await;
    assert_eq!(desc.members.len(), 1, "a is gone from the group at once");
    assert!(b.close().await.unwrap().left);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failing_entry_is_retried_in_order_then_dead_lettered() {
    let env = Env::start("dlq").await;
    let attempts = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(u32, String, u32)>::new()));
    let log = attempts.clone();
    let c = env
        .builder("a")
        .max_deliveries(3)
        .handler(move |m: Message| {
            let log = log.clone();
            async move {
                let n = m.get_str("n").unwrap_or_default().to_owned();
                log.lock().unwrap().push((m.shard().0, n.clone(), m.delivery_count()));
                if n == "poison" {
                    Err(format!("cannot handle {}", m.id()))
                } else {
                    Ok(())
                }
            }
        })
        .build()
        .unwrap()
        .spawn();
    wait_status(&c, Duration::from_secs(10), "reads all 8", |s| s.reading.len() == 8).await;
    let mut con = env.redis.connection().await;
    let key = env.shard_key(2);
    let poison: String = redis::cmd("XADD")
        .arg(&key)
        .arg("*")
        .arg("n")
        .arg("poison")
        .query_async(&mut con)
        .await
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&key)
        .arg("*")
        .arg("n")
        .arg("after")
        .query_async(&mut con)
        .await
        .unwrap();

    let dlq = keys::dead_letter_stream(&env.stream, ShardId(2));
    test_support::wait_until(
        Duration::from_secs(10),
        "the poison entry in the dead-letter stream",
        || {
            let client = env.redis.client();
            let dlq = dlq.clone();
            async move {
                let mut con = client.get_multiplexed_async_connection().await.unwrap();
                let len: u64 = redis::cmd("XLEN").arg(&dlq).query_async(&mut con).await.unwrap();
                len == 1
            }
        },
    )
    .await;
    test_support::wait_until(
        Duration::from_secs(10),
        "the entry after the poison one handled",
        || {
            let done = attempts.lock().unwrap().iter().any(|(_, n, _)| n == "after");
            async move { done }
        },
    )
    .await;
    let log = attempts.lock().unwrap().clone();
    let on_shard: Vec<_> = log
        .iter()
        .filter(|(s, _, _)| *s == 2)
        .map(|(_, n, d)| (n.clone(), *d))
        .collect();
    assert_eq!(
        on_shard,
        vec![
            ("poison".into(), 1),
            ("poison".into(), 2),
            ("poison".into(), 3),
            ("after".into(), 1)
        ],
        "retried in place (the shard waits), then dead-lettered, then the next entry"
    );
    let entries: Vec<(String, std::collections::HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(&dlq)
        .arg("-")
        .arg("+")
        .query_async(&mut con)
        .await
        .unwrap();
    let fields = &entries[0].1;
    assert_eq!(
        fields.get("n").map(String::as_str),
        Some("poison"),
        "original fields kept"
    );
    assert_eq!(fields.get(dead_letter::FIELD_ORIGINAL_ID), Some(&poison));
    assert_eq!(fields.get(dead_letter::FIELD_DELIVERIES).map(String::as_str), Some("3"));
    assert!(fields[dead_letter::FIELD_ERROR].contains("cannot handle"), "{fields:?}");
    test_support::wait_until(Duration::from_secs(5), "nothing pending", || async {
        env.pending_total().await == 0
    })
    .await;
    c.close().await.unwrap();
}
