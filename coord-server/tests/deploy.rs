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

/// The several-teams overlay: its settings are real flags, its example token table is one the coordinator starts
/// with (distinct names, quotas it accepts), and it mounts the table where `COORD_TOKENS_FILE` points.
#[test]
fn the_multi_team_overlay_uses_real_flags_and_a_token_table_that_parses() {
    let help = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .expect("coord-server --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let config = manifest("multi-team/configmap-patch.yaml");
    let patch = manifest("multi-team/coordinator-patch.yaml");
    let mut keys = Vec::new();
    for text in [&config, &patch] {
        for line in text.lines() {
            let line = line.trim().trim_start_matches("- name: ");
            let key = line.split_once(':').map_or(line, |(k, _)| k);
            if key.starts_with("COORD_") {
                keys.push(key.to_owned());
            }
        }
    }
    for key in &keys {
        assert!(
            help.contains(&format!("env: {key}")),
            "{key} is not a coord-server variable"
        );
    }
    for key in ["COORD_TOKENS_FILE", "COORD_METADATA_REDIS_URL", "COORD_QUOTA_GROUPS"] {
        assert!(keys.iter().any(|k| k == key), "{key} missing: {keys:?}");
    }
    let tokens_file = value_of(&config, "COORD_TOKENS_FILE", None);
    let mount = value_of(&patch, "mountPath", None);
    assert_eq!(tokens_file, format!("{mount}/tokens"));

    let secret = manifest("multi-team/secret.example.yaml");
    let table: String = secret
        .split_once("tokens: |\n")
        .expect("a tokens block")
        .1
        .lines()
        .take_while(|l| l.starts_with("    "))
        .map(|l| format!("{}\n", l.trim()))
        .collect();
    let grants = coord_server::auth::Grant::parse_table(&table).expect("the example table parses");
    assert!(grants.len() >= 7, "{grants:?}");
    let mut config = coord_server::Config::new("redis://127.0.0.1:6379");
    config.tokens = grants;
    config
        .validate()
        .expect("the coordinator starts with the example table");
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

#[test]
fn probes_and_the_scrape_use_the_probe_listener_which_the_service_leaves_out() {
    let config = manifest("configmap.yaml");
    let probe_listen: std::net::SocketAddr = value_of(&config, "COORD_PROBE_LISTEN", None)
        .parse()
        .expect("an address");
    let listen: std::net::SocketAddr = value_of(&config, "COORD_LISTEN", None).parse().expect("an address");
    assert_ne!(probe_listen.port(), listen.port());
    let d = manifest("coordinator.yaml");
    let probe_port = probe_listen.port().to_string();
    assert_eq!(value_of(&d, "containerPort", Some("- name: probes")), probe_port);
    assert_eq!(
        value_of(&d, "containerPort", Some("- name: http")),
        listen.port().to_string()
    );
    for probe in ["readinessProbe:", "livenessProbe:", "startupProbe:"] {
        assert_eq!(value_of(&d, "port", Some(probe)), "probes", "{probe}");
    }
    assert_eq!(value_of(&d, "prometheus.io/port", None), probe_port);
    let service = manifest("service.yaml");
    assert_eq!(value_of(&service, "targetPort", None), "http");
    assert!(
        !service.contains(&format!("port: {probe_port}")) && !service.contains("targetPort: probes"),
        "clients must not reach the probe port through the Service:\n{service}"
    );
}

/// The metric names docs/metrics.md documents (a test in metrics.rs ties that page to the code and the SDKs), with
/// whether each is a histogram.
fn documented_metrics() -> std::collections::BTreeMap<String, bool> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let page = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    page.lines()
        .filter_map(|l| {
            let name = l.strip_prefix("| `")?.split('`').next()?;
            name.starts_with("redis_stream_")
                .then(|| (name.to_owned(), l.contains("| histogram |")))
        })
        .collect()
}

/// The `redis_stream_…` tokens of a PromQL expression.
fn metric_tokens(expr: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("redis_stream_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        out.push(&tail[..end]);
        rest = &tail[end..];
    }
    out
}

#[test]
fn every_grafana_query_names_a_real_metric() {
    let documented = documented_metrics();
    assert!(documented.len() >= 40, "{documented:?}");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/redis-stream-coord.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut checked = 0;
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let tokens = metric_tokens(expr);
            assert!(!tokens.is_empty(), "{expr}: no metric");
            for token in tokens {
                let known = documented.contains_key(token)
                    || ["_bucket", "_sum", "_count"].iter().any(|s| {
                        token
                            .strip_suffix(s)
                            .is_some_and(|base| documented.get(base) == Some(&true))
                    });
                assert!(known, "{expr}: {token} is not a documented metric");
                checked += 1;
            }
        }
    }
    assert!(checked >= 20, "{checked}");
}

#[test]
fn metric_tokens_are_cut_at_the_name() {
    assert_eq!(
        metric_tokens("sum(rate(redis_stream_coord_x_bucket[5m])) / redis_stream_y"),
        ["redis_stream_coord_x_bucket", "redis_stream_y"]
    );
}
