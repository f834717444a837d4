//! The reader's dedicated connection for the blocking `XREADGROUP`: opened where [`redis_link::KeyRoute`] says
//! (the shard key's slot master on a cluster, moved after `MOVED`, `ASK` or a lost connection), the read itself
//! with the queued acknowledgements in the same round trip, and a stop that abandons a read still blocked by
//! closing the connection.
//!
//! # Why a stop closes the connection
//! `CLIENT UNBLOCK` would end the read at once and let the reader wait for its answer, but Redis's ACL cannot limit
//! it to the caller's own connections: a user allowed it may unblock every other tenant's blocked reads too. So
//! the consumer's ACL user has no `CLIENT UNBLOCK`, and a stop drops the read and its connection instead; Redis
//! ends a blocked command when its connection closes. The close travels ahead of everything the stop causes (the
//! `REVOKED` heartbeat, the next owner's claim of the pending entries), so in practice Redis has ended the read
//! before the next owner claims; if it had not, an entry it then delivered would wait in this member's pending
//! list until the next owner's periodic claim (`ReaderShared::reclaim_every`), the
//! same bound as a read delayed by the network (at-least-once either way).

use redis::{RedisError, Value};
use redis_link::PipelinedConnection;
use tracing::debug;

use super::reader::{reply_error, Dedicated, Reader};
use crate::stream_reply::{self, RawEntry};

impl Reader {
    /// Opens a dedicated connection and names it (`CLIENT SETNAME stream-consumer:<member>:<shard>`, for an
    /// operator's `CLIENT LIST`; a refusal only leaves it unnamed).
    pub(super) async fn connect_dedicated(&mut self) -> Result<Dedicated, RedisError> {
        let route = self.route.next(&self.shared.redis).await?;
        let client = self.shared.redis.client(&route)?;
        let connected = PipelinedConnection::connect(
            client.get_connection_info(),
            self.shared.redis.tls(),
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
        let named: Result<(), RedisError> = redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(name)
            .query_async(&mut conn)
            .await;
        match named {
            Ok(()) => {}
            Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => {
                self.route.lost();
                return Err(e);
            }
            Err(e) => debug!(shard = %self.shard, error = %e, "CLIENT SETNAME refused; the connection stays unnamed"),
        }
        Ok(Dedicated { conn, route })
    }

    /// One blocking `XREADGROUP`: its entries, or `None` when a stop came while it was blocked (the read is
    /// abandoned: the caller must drop `dedicated`, which closes the connection and so ends the read on the
    /// server; see the module docs).
    ///
    /// The queued acknowledgements (the previous read's entries) are sent on the same connection just before
    /// the read, without waiting for their answer first: both travel in one round trip, and the entries stop
    /// being in flight as soon as the `XACK` answer arrives (it comes before the read's, which may block). If it
    /// fails they stay queued and are sent again on the shared connection before anything is claimed.
    pub(super) async fn blocking_read(
        &mut self,
        dedicated: &mut Dedicated,
    ) -> Result<Option<Vec<RawEntry>>, RedisError> {
        if !self.within_lease() {
            // Neither the read nor the queued acknowledgements go out; the caller waits for the lease.
            return Ok(Some(Vec::new()));
        }
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
        // Handed over now (after the acknowledgements, on the same connection); its reply comes back as RESP bytes
        // and is decoded straight into entries.
        let read = conn.submit_frames(vec![read_pipe.get_packed_pipeline().into()], skip + 1);
        tokio::pin!(read);
        let reply = loop {
            tokio::select! {
                biased;
                r = &mut ack, if !ack_done => {
                    ack_done = true;
                    if let Some(Ok(_)) = r {
                        self.acks.clear();
                    }
                }
                r = &mut read => break Some(r),
                _ = self.stop.cancelled() => break None,
            }
        };
        let Some(reply) = reply else {
            // Abandoned with its connection; acknowledgements not answered yet stay queued for the shared
            // connection (XACK is idempotent).
            return Ok(None);
        };
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
        stream_reply::read_group_frame(&frame).map(Some).map_err(reply_error)
    }
}
