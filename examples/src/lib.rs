//! Example programs (see src/bin) and what the demo shares with its tests: a private `redis-server` launcher
//! ([`redis_launcher`]) and the demo's delivery bookkeeping ([`ledger`]).

pub mod ledger;
pub mod redis_launcher;

/// Fills `values` from the deprecated environment variable `old` (comma-separated) when nothing set them, with a
/// warning on stderr naming `new`. The examples' old names (`COORDINATOR_URL`, `COORDINATOR_TOKEN`) keep working
/// this way; docs/configuration.md lists the current ones.
pub fn deprecated_env_alias(values: &mut Vec<String>, old: &str, new: &str) {
    if !values.is_empty() {
        return;
    }
    let Ok(text) = std::env::var(old) else {
        return;
    };
    values.extend(
        text.split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned),
    );
    if !values.is_empty() {
        eprintln!("warning: {old} is deprecated, use {new}");
    }
}
