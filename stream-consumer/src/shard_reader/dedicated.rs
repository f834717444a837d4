//! The reader's dedicated connection for the blocking `XREADGROUP`: opened where [`redis_link::KeyRoute`] says
//! (the shard key's slot master on a cluster, moved after `MOVED`, `ASK` or a lost connection), the read itself
//! with the queued acknowledgements in the same round trip, and `CLIENT UNBLOCK` when the reader stops.

use std::time::Duration;

use redis::{RedisError, Value};
use redis_link::{PipelinedConnection, Route};
use tracing::debug;

use super::reader::{reply_error, Dedicated, Reader};
use crate::stream_reply::{self, RawEntry};

/// Pause between two `CLIENT UNBLOCK`s of a read that has not returned yet.
const UNBLOCK_RETRY: Duration = Duration::from_millis(50);

impl Reader {
    /// Opens a dedicated connection and learns its `CLIENT ID` (for `CLIENT UNBLOCK`). Without the id (an ACL that
    /// forbids `CLIENT`), a stop waits for the read to return on its own, at most `read_block`.
    pub(super) async fn connect_dedicated(&mut self) -> Result<Dedicated, RedisError> {
        let route = self.route.next(&self.shared.redis).await?;
        let client = self.shared.redis.client(&route)?;
        let connected = PipelinedConnection::connect(
            client.get_connection_info(),
            Some(crate::redis_nodes::CONNECT_TIMEOUT),
            Some(self.shared.blocking_response_timeout()),
        )
        .await;
        let mut conn = match connected {
            Ok(conn) => conn,
            Err(e) => {
                // The node may be gone (a failover): ask the cluster again next time.
                self.route.lost();
                return Err(e);
            }
        };
        let name = format!("stream-consumer:{}:{}", self.shared.member_id, self.shard);
        let named: Result<((), i64), RedisError> = redis::pipe()
            .cmd("CLIENT")
            .arg("SETNAME")
            .arg(name)
            .cmd("CLIENT")
            .arg("ID")
            .query_async(&mut conn)
            .await;
        let client_id = match named {
            Ok(((), id)) => Some(id),
            Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => {
                self.route.lost();
                return Err(e);
            }
            Err(e) => {
                debug!(shard = %self.shard, error = %e, "CLIENT SETNAME/ID refused; stops wait for BLOCK to run out");
                None
            }
        };
        Ok(Dedicated { conn, client_id, route })
    }

    /// Ends a blocking read of client `id` on the node of `route` (it answers as if `BLOCK` ran out).
    pub(super) async fn unblock(&self, route: &Route, id: i64) {
        if let Err(e) = self.shared.redis.unblock(&self.shared.conn, route, id).await {
            debug!(shard = %self.shard, error = %e, "CLIENT UNBLOCK failed");
        }
    }

    /// One blocking `XREADGROUP`. A stop while blocked unblocks the read and still waits for its answer.
    ///
    /// The queued acknowledgements (the previous read's entries) are sent on the same connection just before
    /// the read, without waiting for their answer first: both travel in one round trip, and the entries stop
    /// being in flight as soon as the `XACK` answer arrives (it comes before the read's, which may block). If it
    /// fails they stay queued and are sent again on the shared connection before anything is claimed.
    pub(super) async fn blocking_read(&mut self, dedicated: &mut Dedicated) -> Result<Vec<RawEntry>, RedisError> {
        if !self.within_lease() {
            // Neither the read nor the queued acknowledgements go out; the caller waits for the lease.
            return Ok(Vec::new());
        }
        let client_id = dedicated.client_id;
        let asking = dedicated.route.asking();
        let conn = &mut dedicated.conn;
        let mut read_pipe = redis::pipe();
        if asking {
            // Applies to the next command only: sent in one write with the read, its answer skipped.
            read_pipe.cmd("ASKING");
        }
        read_pipe.add_command(self.cmds.read_new(self.shared.batch_size, self.shared.read_block));
        let skip = usize::from(asking);
        // While asking, the acknowledgements wait for the shared connection (they would need ASKING too).
        // Handed over first, so it is answered before the read (which may block).
        let ack = (!self.acks.is_empty() && !asking).then(|| {
            let answer = conn.submit(vec![self.cmds.ack(self.acks.ids()).get_packed_command().into()], 1);
            async move {
                match answer.await?.pop() {
                    Some(Value::ServerError(e)) => Err(RedisError::from(e)),
                    Some(_) => Ok(()),
                    None => Err(RedisError::from((redis::ErrorKind::Parse, "XACK answered nothing"))),
                }
            }
        });
        let mut ack_done = ack.is_none();
        let ack = futures::future::OptionFuture::from(ack);
        tokio::pin!(ack);
        self.blocked_client = client_id.map(|id| (id, dedicated.route.clone()));
        let route = dedicated.route.clone();
        // Handed over now (after the acknowledgements, on the same connection); its reply comes back as RESP bytes
        // and is decoded straight into entries.
        let read = conn.submit_frames(vec![read_pipe.get_packed_pipeline().into()], skip + 1);
        tokio::pin!(read);
        let mut unblock_at: Option<tokio::time::Instant> = None;
        let reply = loop {
            tokio::select! {
                biased;
                r = &mut ack, if !ack_done => {
                    ack_done = true;
                    if let Some(Ok(_)) = r {
                        self.acks.clear();
                    }
                }
                r = &mut read => break r,
                _ = self.stop.cancelled(), if unblock_at.is_none() && client_id.is_some() => {
                    unblock_at = Some(tokio::time::Instant::now());
                }
                // Repeated: an UNBLOCK that reaches Redis before the read itself (they travel on different
                // connections) finds nothing to unblock.
                _ = tokio::time::sleep_until(unblock_at.unwrap_or_else(tokio::time::Instant::now)), if unblock_at.is_some() => {
                    if let Some(id) = client_id {
                        self.unblock(&route, id).await;
                    }
                    unblock_at = Some(tokio::time::Instant::now() + UNBLOCK_RETRY);
                }
            }
        };
        self.blocked_client = None;
        if !ack_done {
            // Sent before the read on the same connection: answered by now (or failed with it).
            if let Some(Ok(_)) = ack.await {
                self.acks.clear();
            }
        }
        let frame = reply?.pop().unwrap_or_default();
        if frame.first() == Some(&b'-') {
            // An error reply: read by the parser every other reply goes through, so its kind (NOGROUP, MOVED, ASK)
            // is redis-rs's.
            return Err(match redis_link::resp::parse(&frame) {
                Ok(Some((Value::ServerError(e), _))) => e.into(),
                _ => RedisError::from((redis::ErrorKind::Parse, "unreadable XREADGROUP error reply")),
            });
        }
        stream_reply::read_group_frame(&frame).map_err(reply_error)
    }
}
