//! The consumer's membership state: the shared pure rules of [`client_core::membership`], driven by the
//! member supervisor ([`crate::supervisor`]).

pub(crate) use client_core::membership::{Membership, ShardState};
