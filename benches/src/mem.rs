//! Memory of this process for the benchmarks: the resident set now and its peak since the last reset.

/// A `kB` line (`VmRSS`, `VmHWM`) of `/proc/self/status`, in MiB; `None` where it cannot be read.
pub fn status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_mib(&status, field)
}

pub(crate) fn parse_status_mib(status: &str, field: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line[field.len()..]
        .strip_prefix(':')?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Resets the peak resident set size (`VmHWM`) to the current one; false where the kernel does not allow it.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_kb_line_in_mib_and_refuses_a_prefix_or_junk() {
        let status = "VmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\nVmRSSX:\t1 kB\nVmSwap:\tjunk kB\n";
        assert_eq!(parse_status_mib(status, "VmRSS"), Some(10.0));
        assert_eq!(parse_status_mib(status, "VmHWM"), Some(20.0));
        assert_eq!(parse_status_mib(status, "VmSwap"), None);
        assert_eq!(parse_status_mib(status, "VmData"), None);
    }

    #[test]
    fn this_process_has_a_resident_set() {
        let rss = status_mib("VmRSS").expect("Linux /proc");
        assert!(rss > 0.0);
    }
}
