//! Example programs (see src/bin) and what they share with their tests: the demo itself ([`demo`], run by the
//! `demo` binary), the demo's delivery bookkeeping
//! ([`ledger`]), fenced writes to a Redis hash for the `fenced_writer` worker ([`fenced_write`]), and the workers'
//! shared flags ([`member_args`], [`coordinator_tls`]).

/// The allocator of every binary of this crate (feature `jemalloc`, on by default). Records are allocated by the
/// caller's task and freed by the producer's batcher or a connection's task, often on another thread; glibc's
/// allocator handles that pattern badly (BENCHMARKS.md, issue 17). A library cannot choose for its embedding
/// application, so the SDK crates leave the choice to it.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

pub mod coordinator_tls;
pub mod demo;
pub mod fenced_write;
pub mod ledger;
pub mod member_args;

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

/// `err` and its causes, `: `-separated, each said once. `{:#}` repeats a cause whose text an outer error already
/// embeds (a connection error shown three times over); this leaves out a cause that the text so far contains.
pub fn error_chain(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[test]
    fn a_cause_embedded_by_its_parent_is_said_once() {
        let io = std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused (os error 111)",
        );
        let e = anyhow::Error::new(io)
            .context("redis: Connection refused (os error 111)")
            .context("cannot start the in-process coordinator");
        assert_eq!(
            error_chain(&e),
            "cannot start the in-process coordinator: redis: Connection refused (os error 111)"
        );
    }
}
