//! The demo's private redis-server: starts on a free port, answers PING, is gone after drop.

use examples::redis_launcher::RedisLauncher;
use std::net::TcpStream;

#[tokio::test]
async fn starts_answers_and_is_killed_on_drop() {
    let server = RedisLauncher::start().await.unwrap_or_else(|e| panic!("{e}"));
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
