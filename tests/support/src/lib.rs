//! Test harness (filled in by the harness work).
