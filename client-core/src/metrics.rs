//! The metric handles both SDKs record through, written once: [`facade`] forwards to the
//! [`metrics`](https://docs.rs/metrics/0.24) facade (this crate's `metrics` feature, which each SDK's own
//! `metrics` feature turns on), [`noop`] has the same shape and records nothing.
//!
//! An SDK picks one of the two by *its own* feature, not by this crate's: with cargo's feature unification, an
//! application that enables metrics in one SDK turns on this crate's `metrics` feature for the other SDK too,
//! and the other SDK built without the feature must still record nothing.
//!
//! ```ignore
//! #[cfg(feature = "metrics")]
//! use client_core::metrics::facade as handles;
//! #[cfg(not(feature = "metrics"))]
//! use client_core::metrics::noop as handles;
//! ```

/// Labels of one series: `(name, value)` pairs.
pub type Labels<'a> = &'a [(&'static str, String)];

/// Handles into the `metrics` facade's global recorder.
#[cfg(feature = "metrics")]
pub mod facade {
    use super::Labels;
    use ::metrics::Label;

    /// A counter registered with the recorder installed when it was made. `Default` records nothing (for unit
    /// tests that build an SDK's metrics without a recorder).
    #[derive(Debug, Clone)]
    pub struct Counter(::metrics::Counter);

    impl Default for Counter {
        fn default() -> Self {
            Counter(::metrics::Counter::noop())
        }
    }

    impl Counter {
        /// Adds `value`.
        pub fn increment(&self, value: u64) {
            self.0.increment(value);
        }
    }

    /// A gauge registered with the recorder installed when it was made. `Default` records nothing.
    #[derive(Debug, Clone)]
    pub struct Gauge(::metrics::Gauge);

    impl Default for Gauge {
        fn default() -> Self {
            Gauge(::metrics::Gauge::noop())
        }
    }

    impl Gauge {
        /// Sets the gauge to `value`.
        pub fn set(&self, value: f64) {
            self.0.set(value);
        }
    }

    fn labels(labels: Labels<'_>) -> Vec<Label> {
        labels.iter().map(|(k, v)| Label::new(*k, v.clone())).collect()
    }

    /// Registers the gauge `name` with `labels` in the recorder installed now.
    pub fn gauge(name: &'static str, l: Labels<'_>) -> Gauge {
        Gauge(::metrics::gauge!(name, labels(l)))
    }

    /// Registers the counter `name` with `labels` in the recorder installed now.
    pub fn counter(name: &'static str, l: Labels<'_>) -> Counter {
        Counter(::metrics::counter!(name, labels(l)))
    }
}

/// Stand-ins with the same methods as [`facade`]'s: every update compiles to nothing.
pub mod noop {
    use super::Labels;

    /// A counter that records nothing.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Counter;

    impl Counter {
        /// Does nothing.
        pub fn increment(&self, _value: u64) {}
    }

    /// A gauge that records nothing.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Gauge;

    impl Gauge {
        /// Does nothing.
        pub fn set(&self, _value: f64) {}
    }

    /// A gauge that records nothing.
    pub fn gauge(_name: &'static str, _labels: Labels<'_>) -> Gauge {
        Gauge
    }

    /// A counter that records nothing.
    pub fn counter(_name: &'static str, _labels: Labels<'_>) -> Counter {
        Counter
    }
}
