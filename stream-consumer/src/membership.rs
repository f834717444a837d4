//! The consumer's membership state: the shared pure rules of [`client_core::membership`], driven by the
//! heartbeat loop ([`crate::heartbeat`]).

pub(crate) use client_core::membership::{Membership, ShardState};
