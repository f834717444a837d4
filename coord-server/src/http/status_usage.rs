//! The usage section of `GET /status`: per tenant, the entries and memory of its shard streams, and each Redis's
//! memory against its `maxmemory` (the same scrape as the per-tenant metrics, [`crate::tenants`]).

use std::fmt::Write as _;

use super::status::escape;
use crate::auth::Access;
use crate::tenants::{UsageReport, DEFAULT_TENANT};

/// Renders `report` as the page's "Tenants" section: the tenants `access` covers (a tenant token sees its own
/// prefix and those under it); the default tenant and the Redis memory only for a token that covers every stream.
pub(super) fn render_usage(out: &mut String, report: Option<&UsageReport>, access: &Access) {
    out.push_str("<section class=\"usage\"><h2>Tenants (data Redis)</h2>");
    let Some(report) = report else {
        out.push_str("<p>No usage scrape has succeeded yet.</p></section>");
        return;
    };
    out.push_str(
        "<table><tr><th>tenant</th><th>streams</th><th>shards</th><th>entries</th><th>memory (bytes)</th></tr>",
    );
    for t in &report.tenants {
        let shown = if t.tenant == DEFAULT_TENANT {
            access.covers_all()
        } else {
            access.covers(&t.tenant)
        };
        if !shown {
            continue;
        }
        let _ = write!(
            out,
            "<tr class=\"tenant\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&t.tenant),
            t.streams,
            t.shards,
            t.length,
            t.memory_bytes
        );
    }
    out.push_str("</table>");
    if report.truncated {
        out.push_str("<p>Some shards were left out of the scrape (bound reached): sums are too low.</p>");
    }
    if access.covers_all() {
        out.push_str("<table><tr><th>Redis</th><th>used memory</th><th>maxmemory</th><th>used</th></tr>");
        for r in &report.redis {
            let share = if r.max_bytes == 0 {
                "no limit".to_owned()
            } else {
                format!("{:.0} %", r.used_bytes as f64 * 100.0 / r.max_bytes as f64)
            };
            let _ = write!(
                out,
                "<tr class=\"redis\"><td>{}</td><td>{}</td><td>{}</td><td>{share}</td></tr>",
                r.redis, r.used_bytes, r.max_bytes
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</section>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::StreamScope;
    use crate::tenants::{RedisMemory, TenantUsage};

    fn report() -> UsageReport {
        let t = |tenant: &str, length| TenantUsage {
            tenant: tenant.into(),
            streams: 1,
            shards: 2,
            length,
            memory_bytes: length * 10,
        };
        UsageReport {
            tenants: vec![t("a.", 5), t("b.", 7), t(DEFAULT_TENANT, 9)],
            redis: vec![RedisMemory {
                redis: "data",
                used_bytes: 50,
                max_bytes: 100,
            }],
            truncated: false,
        }
    }

    #[test]
    fn a_tenant_token_sees_its_own_row_only() {
        let mut page = String::new();
        let scoped = Access::Scoped(vec![StreamScope::Prefix("a.".into())]);
        render_usage(&mut page, Some(&report()), &scoped);
        assert!(
            page.contains("<td>a.</td><td>1</td><td>2</td><td>5</td><td>50</td>"),
            "{page}"
        );
        assert!(!page.contains("<td>b.</td>") && !page.contains("default"), "{page}");
        assert!(!page.contains("class=\"redis\""), "{page}");

        let mut page = String::new();
        render_usage(&mut page, Some(&report()), &Access::Open);
        assert!(
            page.contains("<td>b.</td>") && page.contains("<td>default</td>"),
            "{page}"
        );
        assert!(
            page.contains("<td>data</td><td>50</td><td>100</td><td>50 %</td>"),
            "{page}"
        );
    }

    #[test]
    fn no_scrape_yet_says_so() {
        let mut page = String::new();
        render_usage(&mut page, None, &Access::Open);
        assert!(page.contains("No usage scrape"), "{page}");
    }
}
