//! Scenario tests live in `tests/`; see tests/README.md.
