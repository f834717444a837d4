//! The Kubernetes manifests agree with the binary and with the shutdown gate: every `COORD_*` variable of the
//! ConfigMap is a real flag, the rollout keeps a coordinator serving, the probes hit the right routes, and the
//! termination grace covers the preStop sleep plus what the gate waits for.

use std::path::Path;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_coord-server");

fn manifest(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The value after `key:` on the first line that has it (after `after`, when given), unquoted.
fn value_of(text: &str, key: &str, after: Option<&str>) -> String {
    let start = after.map_or(0, |a| text.find(a).unwrap_or_else(|| panic!("{a} not found")));
    text[start..]
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .unwrap_or_else(|| panic!("{key} not found"))
}

#[test]
fn the_config_map_uses_only_real_flags() {
    let help = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .expect("coord-server --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let config = manifest("configmap.yaml");
    let mut checked = 0;
    for line in config.lines() {
        let Some((key, _)) = line.trim().split_once(':') else {
            continue;
        };
        if key.starts_with("COORD_") {
            assert!(
                help.contains(&format!("env: {key}")),
                "{key} is not a coord-server variable:\n{help}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 5, "{config}");
    let deployment = manifest("coordinator.yaml");
    for key in ["REDIS_URL", "COORD_ADMIN_TOKEN", "COORD_CLIENT_TOKEN"] {
        assert!(deployment.contains(&format!("name: {key}")), "{key}");
        assert!(help.contains(&format!("env: {key}")), "{key}");
    }
}

#[test]
fn the_rollout_and_the_termination_grace_fit_the_shutdown_gate() {
    let d = manifest("coordinator.yaml");
    assert_eq!(value_of(&d, "replicas", None), "2");
    assert_eq!(value_of(&d, "maxUnavailable", None), "0");
    assert_eq!(value_of(&d, "maxSurge", None), "1");
    assert_eq!(value_of(&d, "path", Some("readinessProbe:")), "/readyz");
    assert_eq!(value_of(&d, "path", Some("livenessProbe:")), "/healthz");
    assert_eq!(value_of(&d, "prometheus.io/path", None), "/metrics");

    let grace: u64 = value_of(&d, "terminationGracePeriodSeconds", None)
        .parse()
        .expect("seconds");
    let pre_stop: u64 = value_of(&d, "seconds", Some("lifecycle:")).parse().expect("seconds");
    let request_timeout_ms: u64 = value_of(&manifest("configmap.yaml"), "COORD_REQUEST_TIMEOUT_MS", None)
        .parse()
        .expect("ms");
    let section = coord_server::Config::default().critical_section_timeout;
    let needed = Duration::from_secs(pre_stop) + Duration::from_millis(request_timeout_ms).max(section);
    assert!(
        Duration::from_secs(grace) > needed,
        "terminationGracePeriodSeconds {grace} must exceed preStop {pre_stop} s + {needed:?} of draining"
    );

    let p = manifest("pdb.yaml");
    assert_eq!(value_of(&p, "minAvailable", None), "1");
    let w = manifest("worker.yaml");
    let worker_grace: u64 = value_of(&w, "terminationGracePeriodSeconds", None)
        .parse()
        .expect("seconds");
    let drain: u64 = value_of(&w, "value", Some("name: DRAIN_TIMEOUT_SECS"))
        .parse()
        .expect("seconds");
    assert!(worker_grace > drain, "the worker's grace must exceed its drain timeout");
}
