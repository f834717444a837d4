//! Forming a cluster from freshly started nodes: ids, the even slot split, `CLUSTER MEET`, replicas, agreement.

use tokio::time::{sleep, Instant};

use super::nodes::{agreed_view, Agreed};
use super::{even_slot_ranges, RedisCluster, CLUSTER_TIMEOUT};
use crate::server::info_field;
use crate::wait::POLL_INTERVAL;

impl RedisCluster {
    /// Forms the cluster from freshly started nodes: slots, meet, replicas, then waits for agreement.
    pub(super) async fn form(&mut self, masters: usize) {
        let ranges = even_slot_ranges(masters);
        self.meet(&ranges).await;
        self.attach_replicas(masters, &ranges).await;
        self.wait_healthy().await;
    }

    /// Gives each master its slot range and joins every node to node 0, until every node knows every other.
    async fn meet(&mut self, ranges: &[(u16, u16)]) {
        for i in 0..self.nodes.len() {
            let mut con = self.nodes[i].server.connection().await;
            let id: String = self
                .query(i, &mut con, redis::cmd("CLUSTER").arg("MYID"), "CLUSTER MYID")
                .await;
            self.nodes[i].id = id;
        }
        for (i, &(first, last)) in ranges.iter().enumerate() {
            let mut con = self.nodes[i].server.connection().await;
            self.query::<()>(
                i,
                &mut con,
                redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(first).arg(last),
                "CLUSTER ADDSLOTSRANGE",
            )
            .await;
        }
        let mut con = self.nodes[0].server.connection().await;
        for other in &self.nodes[1..] {
            let bus = other.server.bus_port().unwrap_or(0);
            self.query::<()>(
                0,
                &mut con,
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(other.port())
                    .arg(bus),
                "CLUSTER MEET",
            )
            .await;
        }
        let ids: Vec<String> = self.nodes.iter().map(|n| n.id.clone()).collect();
        self.wait_views("every node to know every other node", |_, entries| {
            ids.iter().all(|id| entries.iter().any(|e| &e.id == id && !e.failing))
        })
        .await;
    }

    /// Makes node `masters + i` a replica of master `i`, then waits until the roles and the slot split are agreed
    /// and every replica has synced.
    async fn attach_replicas(&mut self, masters: usize, ranges: &[(u16, u16)]) {
        for r in masters..self.nodes.len() {
            let master = self.nodes[r - masters].id.clone();
            let mut con = self.nodes[r].server.connection().await;
            self.query::<()>(
                r,
                &mut con,
                redis::cmd("CLUSTER").arg("REPLICATE").arg(&master),
                "CLUSTER REPLICATE",
            )
            .await;
        }
        let expected: Agreed = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let entry = match ranges.get(i) {
                    Some(&range) => (true, None, vec![range]),
                    None => (false, Some(self.nodes[i - masters].id.clone()), Vec::new()),
                };
                (n.id.clone(), entry)
            })
            .collect();
        self.wait_views(
            "every node to agree on the roles and the even slot split",
            |_, entries| agreed_view(entries) == expected,
        )
        .await;
        for r in masters..self.nodes.len() {
            let deadline = Instant::now() + CLUSTER_TIMEOUT;
            loop {
                let info = self.nodes[r].server.info("replication").await;
                if info_field(&info, "master_link_status") == Some("up") {
                    break;
                }
                if Instant::now() >= deadline {
                    self.fail(format_args!("replica {r} did not sync with its master:\n{info}"));
                }
                sleep(POLL_INTERVAL).await;
            }
        }
    }
}
