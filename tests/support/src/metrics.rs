//! [`MemoryRecorder`]: counters and gauges by name and label set, for tests that read back what the SDKs record.

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

/// A metric name and its labels.
pub type SeriesKey = (String, BTreeMap<String, String>);

/// Counters and gauges by name and label set; reading never resets anything. Histograms are not kept.
///
/// Not metrics-util's `DebuggingRecorder`: its snapshots swap every counter and gauge back to 0, so a second
/// read, or a read by another test sharing the global recorder, would see values that were never recorded.
#[derive(Clone, Default, Debug)]
pub struct MemoryRecorder {
    series: Arc<Mutex<HashMap<SeriesKey, Arc<metrics::atomics::AtomicU64>>>>,
}

impl MemoryRecorder {
    /// The process-global recorder, installed by the first caller (before anything registers a metric: handles
    /// are registered when the SDK's clients are built). Tests of one binary share it and stay apart by labels.
    ///
    /// # Panics
    /// When another global recorder was installed first.
    pub fn global() -> &'static MemoryRecorder {
        static RECORDER: OnceLock<MemoryRecorder> = OnceLock::new();
        RECORDER.get_or_init(|| {
            let r = MemoryRecorder::default();
            metrics::set_global_recorder(r.clone()).expect("no other global recorder in this test binary");
            r
        })
    }

    fn cell(&self, key: &Key) -> Arc<metrics::atomics::AtomicU64> {
        let labels = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        let mut series = self.lock();
        Arc::clone(series.entry((key.name().to_owned(), labels)).or_default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SeriesKey, Arc<metrics::atomics::AtomicU64>>> {
        self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The raw value of one series (`None`: never registered).
    pub fn raw(&self, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        let labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        self.lock()
            .get(&(name.to_owned(), labels))
            .map(|c| c.load(Ordering::Acquire))
    }

    /// A gauge's value (gauges store the bits of an `f64`).
    ///
    /// # Panics
    /// When the series was never registered.
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        f64::from_bits(self.counter(name, labels))
    }

    /// A counter's value.
    ///
    /// # Panics
    /// When the series was never registered.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.raw(name, labels)
            .unwrap_or_else(|| panic!("no series {name}{labels:?}; have {:?}", self.names()))
    }

    /// Every series whose labels include `labels`: (name, full label set).
    pub fn series_with(&self, labels: &[(&str, &str)]) -> Vec<SeriesKey> {
        self.lock()
            .keys()
            .filter(|(_, l)| labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .cloned()
            .collect()
    }

    /// The names of every registered series.
    pub fn names(&self) -> BTreeSet<String> {
        self.lock().keys().map(|(n, _)| n.clone()).collect()
    }
}

impl metrics::Recorder for MemoryRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics::Recorder as _;

    #[test]
    fn reads_do_not_reset_and_labels_select_the_series() {
        let r = MemoryRecorder::default();
        let meta = Metadata::new("t", metrics::Level::INFO, None);
        let a = r.register_counter(&Key::from_parts("hits", vec![metrics::Label::new("s", "a")]), &meta);
        let g = r.register_gauge(&Key::from_name("lag"), &meta);
        a.increment(3);
        g.set(2.5);
        assert_eq!(r.counter("hits", &[("s", "a")]), 3);
        assert_eq!(r.counter("hits", &[("s", "a")]), 3);
        assert_eq!(r.raw("hits", &[("s", "b")]), None);
        assert_eq!(r.gauge("lag", &[]), 2.5);
        assert_eq!(r.series_with(&[("s", "a")]).len(), 1);
    }
}
