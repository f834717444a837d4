//! Picking free loopback ports.

use std::net::{Ipv4Addr, TcpListener};

/// Returns a TCP port on `127.0.0.1` that was free a moment ago.
///
/// The port is found by binding port 0 and releasing it again, so another
/// process may take it before the caller binds it. Callers that start a
/// process on the port must detect that race and retry with a new port (as
/// [`RedisServerBuilder::start`](crate::RedisServerBuilder::start) does).
///
/// # Panics
///
/// Panics if no loopback socket can be bound at all.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap_or_else(|e| panic!("cannot bind a free port on 127.0.0.1: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("cannot read the address of a bound socket: {e}"))
        .port()
}
