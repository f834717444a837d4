//! Example programs; see src/bin.
