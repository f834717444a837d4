//! The demo's private redis-server (`test_support`'s, started as a program starts it: the binary located or
//! provided, failures as errors): starts on a free port, answers PING, is gone after drop.

use std::net::TcpStream;
use test_support::RedisServer;

#[tokio::test]
async fn starts_answers_and_is_killed_on_drop() {
    let server = RedisServer::builder()
        .try_start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = redis::Client::open(server.url()).expect("valid url");
    let mut con = client.get_multiplexed_async_connection().await.expect("connects");
    let pong: String = redis::cmd("PING").query_async(&mut con).await.expect("PING");
    assert_eq!(pong, "PONG");
    let save: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .query_async(&mut con)
        .await
        .expect("CONFIG GET save");
    assert_eq!(save, vec!["save".to_owned(), String::new()], "persistence off");
    let (port, dir) = (server.port(), server.dir().to_path_buf());
    drop(con);
    drop(server);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "the server is gone");
    assert!(!dir.exists(), "its directory is removed");
}
