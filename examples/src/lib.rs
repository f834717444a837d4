//! Example programs (see src/bin) and what they share with their tests: a private `redis-server` launcher
//! ([`redis_launcher`]), the demo's delivery bookkeeping ([`ledger`]), and fenced writes to a Redis hash for the
//! `fenced_writer` worker ([`fenced_write`]).

pub mod fenced_write;
pub mod ledger;
pub mod redis_launcher;
