//! `group_scale_bench` (issue 34, "group scale"): the coordinator with one very large group (part A, [`one_group`]),
//! with very many small groups (part B, [`many_groups`]), and its resident memory with many groups of the largest
//! stream (part C, [`rss`]). Every figure is printed as one line next to its target ([`report`]).
//!
//! Members are simulated ([`member`]): they send the requests a consumer would and read nothing. Parts A and B call
//! an in-process coordinator ([`drive`]); part C runs the `coord-server` binary and speaks HTTP to it. Redis's own
//! counters come from `INFO` ([`redis_stats`]).

pub mod drive;
pub mod many_groups;
pub mod member;
pub mod one_group;
pub mod redis_stats;
pub mod report;
pub mod resp_count;
pub mod rss;
