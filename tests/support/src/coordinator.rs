//! The coordinator configuration of tests: the short [`timings`](crate::timings), a fast tick, and a mutex TTL
//! and section timeout the short lease accepts.

use crate::timings::{group_timings, MUTEX_TTL, SECTION_TIMEOUT, TICK};
use coord_server::server::CoordinatorHandle;
use coord_server::Config;
use std::net::SocketAddr;

/// `127.0.0.1:0`: a free port picked by the system when the coordinator binds.
pub fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A configuration for `redis_url` listening on `listen`, with [`TICK`], [`MUTEX_TTL`], [`SECTION_TIMEOUT`] and
/// the short group timings as the default timings.
pub fn config(redis_url: &str, listen: SocketAddr) -> Config {
    let mut config = Config::new(redis_url);
    config.listen = listen;
    config.tick_interval = TICK;
    config.mutex_ttl = MUTEX_TTL;
    config.critical_section_timeout = SECTION_TIMEOUT;
    config.default_timings = group_timings();
    config
}

/// A coordinator on `redis_url` with [`config`] on a free port.
///
/// # Panics
/// When it does not start.
pub async fn spawn(redis_url: &str) -> CoordinatorHandle {
    CoordinatorHandle::spawn(config(redis_url, any_port()))
        .await
        .expect("coordinator starts")
}
