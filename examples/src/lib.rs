//! Example programs (see src/bin) and what the demo shares with its tests: a private `redis-server` launcher
//! ([`redis_launcher`]) and the demo's delivery bookkeeping ([`ledger`]).

pub mod ledger;
pub mod redis_launcher;
