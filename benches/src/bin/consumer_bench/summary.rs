//! One run's result and the medians of a mode's runs, as the table prints them.

use std::time::Duration;

use anyhow::Result;

use crate::backend::Cost;

/// One measured run.
pub(crate) struct RunResult {
    pub(crate) records: u64,
    pub(crate) took: Duration,
    pub(crate) cost: Cost,
    /// This process's resident set before the run and its peak during it (`VmHWM`, reset before the run), in
    /// MiB; set by [`measured`].
    pub(crate) rss_before_mib: f64,
    pub(crate) peak_rss_mib: Option<f64>,
}

/// Runs one mode with this process's memory measured around it (the peak only where the kernel lets
/// `/proc/self/clear_refs` reset it).
pub(crate) async fn measured(run: impl std::future::Future<Output = Result<RunResult>>) -> Result<RunResult> {
    let rss_before = benches::mem::status_mib("VmRSS").unwrap_or(0.0);
    let resettable = benches::mem::reset_peak_rss();
    let mut result = run.await?;
    result.rss_before_mib = rss_before;
    result.peak_rss_mib = if resettable {
        benches::mem::status_mib("VmHWM")
    } else {
        None
    };
    Ok(result)
}

impl RunResult {
    /// `rss <before> -> peak <peak> MiB`.
    pub(crate) fn memory(&self) -> String {
        match self.peak_rss_mib {
            Some(peak) => format!("rss {:.0} -> peak {peak:.0} MiB", self.rss_before_mib),
            None => format!("rss {:.0} MiB before", self.rss_before_mib),
        }
    }
}

/// The medians of one mode's runs.
pub(crate) struct Summary {
    pub(crate) rate: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) client_us: f64,
    pub(crate) redis_us: f64,
    pub(crate) xreadgroup_per_1000: f64,
    pub(crate) xack_per_1000: f64,
    /// Round 1's memory (`rss <before> -> peak <peak> MiB`).
    pub(crate) memory: String,
}

impl Summary {
    pub(crate) fn of(runs: &[RunResult]) -> Option<Summary> {
        if runs.is_empty() {
            return None;
        }
        let per_record = |f: &dyn Fn(&RunResult) -> f64| median(runs.iter().map(|r| f(r) / r.records.max(1) as f64));
        let rates: Vec<f64> = runs.iter().map(|r| rate(r.records, r.took)).collect();
        Some(Summary {
            rate: median(rates.iter().copied()),
            min: rates.iter().copied().fold(f64::INFINITY, f64::min),
            max: rates.iter().copied().fold(0.0, f64::max),
            client_us: per_record(&|r| r.cost.client_cpu_s * 1e6),
            redis_us: per_record(&|r| r.cost.redis_cpu_s * 1e6),
            xreadgroup_per_1000: per_record(&|r| r.cost.xreadgroup_calls as f64 * 1000.0),
            xack_per_1000: per_record(&|r| r.cost.xack_calls as f64 * 1000.0),
            memory: runs[0].memory(),
        })
    }

    /// The table's columns after the client CPU.
    pub(crate) fn rest(&self) -> String {
        format!(
            "{:.2} us | {:.1} + {:.1} | {}",
            self.redis_us, self.xreadgroup_per_1000, self.xack_per_1000, self.memory
        )
    }
}

/// The median (the mean of the middle two for an even count).
pub(crate) fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The 1-minute load average, as `/proc/loadavg` gives it.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "n/a".to_owned())
}

pub(crate) fn rate(n: u64, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}
