//! Fencing tokens: one number per shard that grows with every new owner, for handlers to pass with their side
//! effects (see `docs/fencing.md`).
//!
//! Rule: a new token is `max(last token of the shard + 1, now)`, with `now` the Redis time (ms) of the committing
//! transition. The `+ 1` makes it strictly increasing within one history; the clock makes it exceed tokens that a
//! lost history (a Redis rollback, a recreated group) minted, which the stored `last` no longer knows:
//! * a rollback opens a correction round, and its close re-mints the token of every owned shard. The round stays
//!   open at least one member TTL, so the close is more than a TTL after any lost mint, which is enough as long
//!   as the new primary's clock lags the old one's by less than a TTL;
//! * a recreated group starts from zero, so its first tokens are Redis times after the recreate.
//!
//! Minted on: a grant (free shard to its target), a new incarnation of an owner (its predecessor may still run
//! handlers with the old token), the close of a correction round, and for owned shards stored without a token.

use protocol::FencingToken;

use super::transition::Tx;

/// The token that follows `last` at Redis time `now_ms`. Saturates at [`FencingToken::MAX`], which Redis time in
/// ms reaches only in about 285,000 years.
pub fn next(last: FencingToken, now_ms: u64) -> FencingToken {
    FencingToken(last.0.saturating_add(1).max(now_ms).min(FencingToken::MAX.0))
}

/// Gives shard `index` a fresh token.
pub fn mint(tx: &mut Tx<'_>, index: usize, now_ms: u64) {
    if let Some(shard) = tx.get_mut().shards.get_mut(index) {
        shard.fencing_token = next(shard.fencing_token, now_ms);
    }
}

/// Gives every shard `pick` selects (by its record) a fresh token, writing only when one does.
pub fn mint_where(tx: &mut Tx<'_>, now_ms: u64, pick: impl Fn(&protocol::metadata::ShardRecord) -> bool) {
    let picked: Vec<usize> = tx
        .get()
        .shards
        .iter()
        .enumerate()
        .filter(|(_, s)| pick(s))
        .map(|(i, _)| i)
        .collect();
    for i in picked {
        mint(tx, i, now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_is_above_the_last_token_and_the_clock() {
        assert_eq!(next(FencingToken(0), 1_000), FencingToken(1_000));
        assert_eq!(next(FencingToken(1_000), 1_000), FencingToken(1_001), "same ms: +1");
        assert_eq!(
            next(FencingToken(5_000), 1_000),
            FencingToken(5_001),
            "clock behind: +1"
        );
        assert_eq!(next(FencingToken::MAX, u64::MAX), FencingToken::MAX, "JSON-safe bound");
    }
}
