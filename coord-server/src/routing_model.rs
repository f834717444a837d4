//! Exhaustive model check of a stream's routing through Redis losses (see `docs/model-check.md`): the real
//! `routing_section` decisions and `state_machine::routing` rules against a modelled Redis, its failovers and
//! restores, and producers that write with the routing they hold. It drives shell code above the pure core, so
//! it sits beside the shell rather than in `state_machine::model`, whose explorer's report types and injected
//! bugs it shares.

mod routing_check;
mod routing_world;
