//! Where a dedicated connection goes: the one server, or the master of a key's slot on a cluster.
//!
//! A blocking command (`XREADGROUP BLOCK`) must own its connection. On a cluster it goes to the master of its
//! key's slot by the slot map ([`KeyRoute`]). A `MOVED` answer re-reads the map and moves the connection to the
//! named master; an `ASK` (the slot is migrating and the key is already on the target) moves it to the named node
//! with `ASKING` before each command until that node serves the slot itself; a lost connection re-reads the map
//! (a failover promoted another master) before the next one opens. A blocked command is ended by closing its
//! connection, never by `CLIENT UNBLOCK`, which Redis's ACL cannot confine to the caller's own connections.

use std::sync::Arc;

use redis::RedisError;

use crate::redirect::{Redirect, RedirectKind};
use crate::router::ClusterRouter;
use crate::tls_setup::RedisTls;
use crate::topology::{NodeAddr, TopologyError};

/// The nodes a component opens dedicated connections to: the one server, or a cluster's.
// One value per component, made once: the size of a TLS client's settings costs nothing here.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Nodes {
    /// One server: every dedicated connection is opened with this client, and for a `rediss://` URL with these
    /// TLS settings (those the client was opened with, [`crate::tls_client`]).
    Single(redis::Client, Option<RedisTls>),
    /// A cluster: dedicated connections go to the master of their key's slot.
    Cluster(Arc<ClusterRouter>),
}

/// Where one dedicated connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// The one server.
    Single,
    /// A cluster node; `asking` while the key's slot migrates to it (`ASKING` before every command).
    Node {
        /// The node.
        node: NodeAddr,
        /// Whether each command must be preceded by `ASKING`.
        asking: bool,
    },
}

impl Route {
    /// Whether commands on this route must be preceded by `ASKING`.
    pub fn asking(&self) -> bool {
        matches!(self, Route::Node { asking: true, .. })
    }
}

/// A slot map that could not be read, as the Redis error callers already handle (an outage).
fn topology_error(e: TopologyError) -> RedisError {
    match e {
        TopologyError::Unreachable(e) => e,
        other => RedisError::from((redis::ErrorKind::Client, "cluster slot map", other.to_string())),
    }
}

impl Nodes {
    /// The route of a connection for `key`: the server, or its slot's master (after re-reading the slot map when
    /// `refresh`, i.e. after the last connection failed).
    ///
    /// # Errors
    /// No slot map could be read.
    pub async fn route_for(&self, key: &str, refresh: bool) -> Result<Route, RedisError> {
        match self {
            Nodes::Single(..) => Ok(Route::Single),
            Nodes::Cluster(router) => Ok(Route::Node {
                node: router
                    .master_of_key(key.as_bytes(), refresh)
                    .await
                    .map_err(topology_error)?,
                asking: false,
            }),
        }
    }

    /// The route after `redirect`; a `MOVED` also re-reads the slot map (the next lookups then agree).
    pub async fn after_redirect(&self, redirect: &Redirect) -> Route {
        match self {
            Nodes::Single(..) => Route::Single,
            Nodes::Cluster(router) => {
                if redirect.kind == RedirectKind::Moved {
                    if let Err(e) = router.refresh().await {
                        tracing::debug!(error = %e, "slot map refresh after MOVED failed");
                    }
                }
                Route::Node {
                    node: redirect.to.clone(),
                    asking: redirect.kind == RedirectKind::Ask,
                }
            }
        }
    }

    /// A client for a dedicated connection on `route`.
    ///
    /// # Errors
    /// A cluster route without a node.
    pub fn client(&self, route: &Route) -> Result<redis::Client, RedisError> {
        match (self, route) {
            (Nodes::Single(client, _), _) => Ok(client.clone()),
            (Nodes::Cluster(router), Route::Node { node, .. }) => router.pool().client(node),
            (Nodes::Cluster(_), Route::Single) => Err(RedisError::from((
                redis::ErrorKind::Client,
                "a cluster connection needs a node",
            ))),
        }
    }

    /// The TLS settings of a connection opened by hand (the pipelined connection) on any route.
    pub fn tls(&self) -> Option<&RedisTls> {
        match self {
            Nodes::Single(_, tls) => tls.as_ref(),
            Nodes::Cluster(router) => router.pool().tls(),
        }
    }

    /// Clients for every server a start-up check must ask: the one server, or every master by a slot map read
    /// now, each with its address for errors.
    ///
    /// # Errors
    /// No slot map could be read.
    pub async fn check_targets(&self) -> Result<Vec<(Option<NodeAddr>, redis::Client)>, RedisError> {
        match self {
            Nodes::Single(client, _) => Ok(vec![(None, client.clone())]),
            Nodes::Cluster(router) => router
                .masters()
                .await
                .map_err(topology_error)?
                .into_iter()
                .map(|node| Ok((Some(node.clone()), router.pool().client(&node)?)))
                .collect(),
        }
    }
}

/// The routing state of one key's dedicated connection: where the next one goes. After a redirect, to the node
/// it named; after a lost connection, to the slot's master by a slot map read again; else by the current map.
#[derive(Debug, Clone)]
pub struct KeyRoute {
    key: String,
    /// Set by a redirect.
    next: Option<Route>,
    /// The last connection failed: a failover may have moved the key's slot to another master.
    refresh: bool,
}

impl KeyRoute {
    /// The route of `key`'s connections.
    pub fn new(key: impl Into<String>) -> Self {
        KeyRoute {
            key: key.into(),
            next: None,
            refresh: false,
        }
    }

    /// Where the next connection goes.
    ///
    /// # Errors
    /// No slot map could be read.
    pub async fn next(&mut self, nodes: &Nodes) -> Result<Route, RedisError> {
        match self.next.clone() {
            Some(route) => Ok(route),
            None => nodes.route_for(&self.key, std::mem::take(&mut self.refresh)).await,
        }
    }

    /// The connection failed (or could not open): the next one goes where a fresh slot map says.
    pub fn lost(&mut self) {
        self.next = None;
        self.refresh = true;
    }

    /// A command was redirected: the next connection goes where `redirect` says.
    pub async fn redirected(&mut self, nodes: &Nodes, redirect: &Redirect) {
        self.next = Some(nodes.after_redirect(redirect).await);
    }
}
