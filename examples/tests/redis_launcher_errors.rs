//! A program's Redis start fails as an error it can report, not a panic: `REDIS_SERVER_BIN` naming no file is
//! refused with a reason that names it (the demo prints it and exits 2). Its own test binary, since it sets the
//! process's environment.

use test_support::RedisServer;

#[tokio::test]
async fn a_server_binary_that_is_not_there_is_a_typed_error_naming_it() {
    std::env::set_var("REDIS_SERVER_BIN", "/nonexistent/redis-server");
    let err = match RedisServer::builder().try_start().await {
        Ok(server) => panic!(
            "started a server from a binary that does not exist, on port {}",
            server.port()
        ),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("REDIS_SERVER_BIN=/nonexistent/redis-server names no file"),
        "the error says which setting is wrong: {err}"
    );
}
