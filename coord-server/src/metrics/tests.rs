//! Names, event labels and the independence of two recorders.

use super::*;
use protocol::ShardId;

#[test]
fn event_kinds_are_snake_case_variant_names() {
    let m = protocol::names::MemberId::new("a").unwrap();
    assert_eq!(event_kind(&Event::MemberExpired(m.clone())), "member_expired");
    assert_eq!(event_kind(&Event::CorrectionClosed), "correction_closed");
    assert_eq!(
        event_kind(&Event::StaleAckIgnored {
            shard: ShardId(1),
            member: m
        }),
        "stale_ack_ignored"
    );
}

#[test]
fn names_follow_prometheus_conventions() {
    let mut seen = HashSet::new();
    for name in names::ALL {
        assert!(seen.insert(name), "{name} listed twice");
        assert!(name.starts_with("redis_stream_coord_"), "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{name}"
        );
        assert!(
            !name.contains("_ms") && !name.contains("millis"),
            "{name}: base units only"
        );
    }
}

#[test]
fn two_recorders_are_independent() {
    let (a, b) = (Metrics::new(), Metrics::new());
    a.heartbeat_answered(Status::Ok, Duration::from_millis(1));
    let ra = a.handle.render();
    let rb = b.handle.render();
    assert!(
        ra.contains("redis_stream_coord_heartbeats_total{status=\"OK\"} 1"),
        "{ra}"
    );
    assert!(
        rb.contains("redis_stream_coord_heartbeats_total{status=\"OK\"} 0"),
        "{rb}"
    );
}

#[test]
fn compatibility_failures_are_recognised() {
    assert!(is_compatibility_failure(&StoreError::Unsupported("x".into())));
    assert!(!is_compatibility_failure(&StoreError::Protocol("x".into())));
}
