//! The pipelined connection against real redis-server processes (and a fault proxy in front of one).

use std::time::Duration;

use redis::{Client, ErrorKind, Value};
use redis_link::{resp, PipelinedConnection};
use test_support::proxy::{FaultProxy, Mode};
use test_support::RedisServer;

const SECOND: Option<Duration> = Some(Duration::from_secs(1));

async fn connect(url: &str, response: Option<Duration>) -> redis::RedisResult<PipelinedConnection> {
    let client = Client::open(url).unwrap();
    PipelinedConnection::connect(client.get_connection_info(), None, SECOND, response).await
}

fn incr(key: &str) -> Vec<u8> {
    let mut buf = Vec::new();
    resp::write_command(&mut buf, 2);
    resp::write_arg(&mut buf, b"INCR");
    resp::write_arg(&mut buf, key.as_bytes());
    buf
}

#[tokio::test]
async fn concurrent_requests_are_answered_in_the_order_each_caller_sent_them() {
    let redis = RedisServer::start().await;
    let con = connect(&redis.url(), SECOND).await.unwrap();
    // 16 tasks, each 200 requests of 1 to 5 INCRs of its own counter: every task must see its counter count up
    // without a gap, so no reply went to another request.
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let con = con.clone();
            tokio::spawn(async move {
                let key = format!("counter-{t}");
                let mut expected = 0i64;
                for i in 0..200 {
                    let n = 1 + (i % 5);
                    let bytes: Vec<u8> = (0..n).flat_map(|_| incr(&key)).collect();
                    let replies = con.send(bytes, n).await.unwrap();
                    for r in replies {
                        expected += 1;
                        assert_eq!(r, Value::Int(expected), "task {t}");
                    }
                }
                expected
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 16 * 600);
}

#[tokio::test]
async fn parts_go_out_back_to_back_and_error_replies_keep_their_kind() {
    let redis = RedisServer::start().await;
    let con = connect(&redis.url(), SECOND).await.unwrap();
    let mut bad = Vec::new();
    resp::write_command(&mut bad, 1);
    resp::write_arg(&mut bad, b"NOSUCHCOMMAND");
    let replies = con
        .send_parts(vec![incr("a").into(), bad.into(), incr("a").into()], 3)
        .await
        .unwrap();
    assert_eq!(replies[0], Value::Int(1));
    let Value::ServerError(e) = &replies[1] else {
        panic!("{:?}", replies[1]);
    };
    assert_eq!(
        redis::RedisError::from(e.clone()).kind(),
        ErrorKind::Server(redis::ServerErrorKind::ResponseError)
    );
    assert_eq!(replies[2], Value::Int(2));
    // Through redis-rs's own query path too.
    let mut c = con.clone();
    let n: i64 = redis::cmd("INCR").arg("a").query_async(&mut c).await.unwrap();
    assert_eq!(n, 3);
    let (x, y): (i64, i64) = redis::pipe()
        .incr("a", 1)
        .incr("b", 1)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!((x, y), (4, 1));
    let err = redis::cmd("EVALSHA")
        .arg("0000000000000000000000000000000000000000")
        .arg(0)
        .query_async::<Value>(&mut c)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server(redis::ServerErrorKind::NoScript));
}

#[tokio::test]
async fn the_url_s_user_password_and_database_are_used() {
    let redis = RedisServer::start().await;
    let mut admin = redis.connection().await;
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "app", "on", ">s3cret", "~*", "+@all"])
        .query_async(&mut admin)
        .await
        .unwrap();
    let authed = redis.url().replace("redis://", "redis://app:s3cret@");
    let mut c = connect(&format!("{authed}/3"), SECOND).await.unwrap();
    let () = redis::cmd("SET")
        .arg("k")
        .arg("in-db-3")
        .query_async(&mut c)
        .await
        .unwrap();
    let whoami: String = redis::cmd("ACL").arg("WHOAMI").query_async(&mut c).await.unwrap();
    assert_eq!(whoami, "app");
    let () = redis::cmd("SELECT").arg(3).query_async(&mut admin).await.unwrap();
    let v: String = redis::cmd("GET").arg("k").query_async(&mut admin).await.unwrap();
    assert_eq!(v, "in-db-3");
    let err = connect(&redis.url().replace("redis://", "redis://app:wrong@"), SECOND)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("WRONGPASS"), "{err}");
}

#[tokio::test]
async fn a_server_that_goes_away_fails_the_waiting_request_and_every_later_one() {
    let mut redis = RedisServer::start().await;
    let con = connect(&redis.url(), Some(Duration::from_secs(10))).await.unwrap();
    // Held in Redis until the server is stopped: the request is waiting when the connection ends.
    let mut blocking = Vec::new();
    resp::write_command(&mut blocking, 3);
    resp::write_arg(&mut blocking, b"BLPOP");
    resp::write_arg(&mut blocking, b"nothing");
    resp::write_arg(&mut blocking, b"0");
    let waiting = {
        let con = con.clone();
        tokio::spawn(async move { con.send(blocking, 1).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    redis.stop().await;
    let err = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("failed at once, not at the response timeout")
        .unwrap()
        .unwrap_err();
    assert!(err.is_io_error(), "{err}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !con.is_closed() {
        assert!(tokio::time::Instant::now() < deadline, "the connection never noticed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let later = con.send(incr("a"), 1).await.unwrap_err();
    assert!(later.is_io_error(), "{later}");
}

#[tokio::test]
async fn a_stalled_server_fails_the_request_at_the_response_timeout() {
    let redis = RedisServer::start().await;
    let proxy = FaultProxy::start(([127, 0, 0, 1], redis.port()).into()).await;
    let con = connect(&proxy.url(), Some(Duration::from_millis(300))).await.unwrap();
    assert_eq!(con.send(incr("a"), 1).await.unwrap(), vec![Value::Int(1)]);
    proxy.set_mode(Mode::Stall);
    let started = std::time::Instant::now();
    let err = con.send(incr("a"), 1).await.unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
}

#[tokio::test]
async fn an_unreachable_server_or_socket_is_a_connect_error() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    drop(redis);
    assert!(connect(&url, SECOND).await.is_err());
    let info = redis::IntoConnectionInfo::into_connection_info("redis+unix:///nonexistent/redis.sock").unwrap();
    assert!(PipelinedConnection::connect(&info, None, SECOND, SECOND).await.is_err());
}

#[tokio::test]
async fn a_submitted_request_is_answered_after_every_handle_is_dropped() {
    let redis = RedisServer::start().await;
    let con = connect(&redis.url(), SECOND).await.unwrap();
    let answer = con.submit(vec![incr("a").into(), incr("a").into()], 2);
    drop(con);
    assert_eq!(answer.await.unwrap(), vec![Value::Int(1), Value::Int(2)]);
}

#[tokio::test]
async fn frames_and_values_interleave_each_request_in_its_own_form() {
    let redis = RedisServer::start().await;
    let con = connect(&redis.url(), SECOND).await.unwrap();
    let mut xadd = Vec::new();
    for i in 0..3 {
        resp::write_command(&mut xadd, 5);
        for arg in [&b"XADD"[..], b"s", format!("1-{i}").as_bytes(), b"f", b"v"] {
            resp::write_arg(&mut xadd, arg);
        }
    }
    let mut range = Vec::new();
    resp::write_command(&mut range, 4);
    for arg in [&b"XRANGE"[..], b"s", b"-", b"+"] {
        resp::write_arg(&mut range, arg);
    }
    let mut wrong = Vec::new();
    resp::write_command(&mut wrong, 2);
    resp::write_arg(&mut wrong, b"GET");
    resp::write_arg(&mut wrong, b"s");
    // Handed over in this order, answered in this order, each in the form it asked for.
    let added = con.submit(vec![xadd.into()], 3);
    let frames = con.submit_frames(vec![range.clone().into(), wrong.into()], 2);
    let value = con.submit(vec![range.into()], 1);
    assert_eq!(added.await.unwrap().len(), 3);
    let frames = frames.await.unwrap();
    let value = value.await.unwrap().pop().unwrap();
    assert_eq!(frames.len(), 2);
    // The frame is the bytes the parser reads as that value.
    assert_eq!(resp::parse(&frames[0]).unwrap(), Some((value, frames[0].len())));
    let mut c = resp::Cursor::new(&frames[0]);
    assert_eq!(c.array().unwrap(), Some(3));
    assert_eq!(c.array().unwrap(), Some(2));
    assert_eq!(c.bulk().unwrap(), Some(&b"1-0"[..]));
    // An error reply is a frame too, read by the parser as the error redis-rs would give.
    assert_eq!(frames[1].first(), Some(&b'-'));
    let Some((Value::ServerError(e), _)) = resp::parse(&frames[1]).unwrap() else {
        panic!("not an error: {:?}", frames[1]);
    };
    assert_eq!(redis::RedisError::from(e).code(), Some("WRONGTYPE"));
}

#[tokio::test]
async fn a_large_reply_arriving_in_many_reads_is_read_whole_in_both_forms() {
    let redis = RedisServer::start().await;
    let con = connect(&redis.url(), Some(Duration::from_secs(30))).await.unwrap();
    // 64 elements of 128 KiB (8 MiB in all, in many reads), then a small reply behind it.
    let items: Vec<Vec<u8>> = (0..64u8)
        .map(|i| (0..128 << 10).map(|j: u32| (j % 251) as u8 ^ i).collect())
        .collect();
    let mut push = Vec::new();
    resp::write_command(&mut push, 2 + items.len());
    resp::write_arg(&mut push, b"RPUSH");
    resp::write_arg(&mut push, b"big");
    for item in &items {
        resp::write_arg(&mut push, item);
    }
    con.send(push, 1).await.unwrap();
    let mut get = Vec::new();
    resp::write_command(&mut get, 4);
    for arg in [&b"LRANGE"[..], b"big", b"0", b"-1"] {
        resp::write_arg(&mut get, arg);
    }
    resp::write_command(&mut get, 2);
    resp::write_arg(&mut get, b"LLEN");
    resp::write_arg(&mut get, b"big");
    let values = con.send(get.clone(), 2).await.unwrap();
    let expected = Value::Array(items.iter().cloned().map(Value::BulkString).collect());
    assert_eq!(values, vec![expected, Value::Int(64)]);
    let frames = con.submit_frames(vec![get.into()], 2).await.unwrap();
    assert_eq!(frames.len(), 2);
    let mut c = resp::Cursor::new(&frames[0]);
    assert_eq!(c.array().unwrap(), Some(64));
    for item in &items {
        assert_eq!(c.bulk().unwrap(), Some(&item[..]));
    }
    assert!(c.is_done());
    assert_eq!(&frames[1][..], b":64\r\n");
}
