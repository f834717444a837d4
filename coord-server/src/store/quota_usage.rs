//! What a token uses, read for its quota view: members of a group (entries of its liveness hash).

use protocol::keys;
use protocol::names::{GroupName, StreamName};

use super::Store;
use crate::error::StoreError;

impl Store {
    /// The members of a group with a lease (`HLEN` of its liveness hash): one command, no aggregate read.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn leased_members(&self, stream: &StreamName, group: &GroupName) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("HLEN")
            .arg(keys::group_liveness(stream, group))
            .query_async(&mut conn)
            .await?)
    }
}
