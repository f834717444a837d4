//! The configured Redis: one server or a cluster's seed nodes.

use std::fmt;

/// Most seed URLs a cluster target may name (a cluster needs only a few to be found).
pub const MAX_SEEDS: usize = 64;

/// Prefix of a cluster target's text form.
const CLUSTER_PREFIX: &str = "cluster:";

/// Where the Redis data lives.
///
/// Text form ([`RedisTarget::parse`], and so the coordinator's `--redis-url` / `REDIS_URL`):
///
/// - `redis://host:port/db` (or `rediss://`, `redis+unix://`): one server, as before;
/// - `cluster:redis://host1:port1,redis://host2:port2`: a Redis Cluster, through the listed seed nodes (any of
///   its nodes; one that answers is enough, the rest of the cluster is discovered from it). User name and
///   password, if any, go in every seed URL; a cluster has only database 0.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One Redis server (or a primary behind a fixed address).
    Single(String),
    /// A Redis Cluster, by seed node URLs (at least one, at most [`MAX_SEEDS`]).
    Cluster(Vec<String>),
}

/// A target text that cannot name a Redis.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// No URL at all.
    #[error("no Redis URL given")]
    Empty,
    /// `cluster:` with an empty entry between commas (or nothing after it).
    #[error("cluster seed {index} is empty (form: cluster:redis://host:port,redis://host:port)")]
    EmptySeed {
        /// Position of the empty entry, from 0.
        index: usize,
    },
    /// More than [`MAX_SEEDS`] seeds.
    #[error("{count} cluster seeds given; at most {MAX_SEEDS} are accepted")]
    TooManySeeds {
        /// Number of seeds given.
        count: usize,
    },
    /// A URL redis-rs does not accept.
    #[error("invalid Redis URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Some cluster seeds are `rediss://` and others not: every node is reached the way the first seed is, so a
    /// mixed list would silently drop TLS (or ask for it) on some seeds.
    #[error("cluster seeds mix rediss:// and redis:// ({url}): every seed must use the same scheme")]
    MixedTls {
        /// The first seed whose scheme differs from the first one's, password redacted.
        url: String,
    },
    /// A cluster seed selects a database other than 0 (Redis Cluster has only database 0).
    #[error("cluster seed {url} selects database {db}; Redis Cluster has only database 0")]
    ClusterDatabase {
        /// The URL, password redacted.
        url: String,
        /// The database it selects.
        db: i64,
    },
}

impl RedisTarget {
    /// Parses the text form (see the type's documentation), checking every URL.
    ///
    /// # Errors
    /// [`TargetError`]: empty text or seed, too many seeds, a URL redis-rs refuses, a cluster seed with a
    /// database other than 0.
    pub fn parse(text: &str) -> Result<Self, TargetError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(TargetError::Empty);
        }
        let Some(list) = text.strip_prefix(CLUSTER_PREFIX) else {
            check_url(text)?;
            return Ok(RedisTarget::Single(text.to_owned()));
        };
        let count = list.split(',').count();
        if count > MAX_SEEDS {
            return Err(TargetError::TooManySeeds { count });
        }
        let mut seeds = Vec::with_capacity(count);
        for (index, seed) in list.split(',').enumerate() {
            let seed = seed.trim();
            if seed.is_empty() {
                return Err(TargetError::EmptySeed { index });
            }
            let db = check_url(seed)?;
            if db != 0 {
                return Err(TargetError::ClusterDatabase {
                    url: protocol::redact::redact_url(seed),
                    db,
                });
            }
            if seeds
                .first()
                .is_some_and(|first: &String| crate::tls_setup::is_tls_url(first) != crate::tls_setup::is_tls_url(seed))
            {
                return Err(TargetError::MixedTls {
                    url: protocol::redact::redact_url(seed),
                });
            }
            seeds.push(seed.to_owned());
        }
        Ok(RedisTarget::Cluster(seeds))
    }

    /// Whether `text` uses the cluster form (starts with `cluster:`), valid or not: lets a caller keep its own
    /// error for a malformed single URL.
    pub fn names_cluster(text: &str) -> bool {
        text.trim_start().starts_with(CLUSTER_PREFIX)
    }

    /// Whether this is a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisTarget::Cluster(_))
    }

    /// The URLs: the one server's, or every seed's.
    pub fn urls(&self) -> &[String] {
        match self {
            RedisTarget::Single(url) => std::slice::from_ref(url),
            RedisTarget::Cluster(seeds) => seeds,
        }
    }

    /// The text form with every password redacted, for logs and errors.
    pub fn redacted(&self) -> String {
        match self {
            RedisTarget::Single(url) => protocol::redact::redact_url(url),
            RedisTarget::Cluster(seeds) => {
                let seeds: Vec<String> = seeds.iter().map(|s| protocol::redact::redact_url(s)).collect();
                format!("{CLUSTER_PREFIX}{}", seeds.join(","))
            }
        }
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl std::str::FromStr for RedisTarget {
    type Err = TargetError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        RedisTarget::parse(text)
    }
}

/// Checks `url` the way the connection will read it; answers its database.
fn check_url(url: &str) -> Result<i64, TargetError> {
    use redis::IntoConnectionInfo;
    let info = url.into_connection_info().map_err(|e| TargetError::InvalidUrl {
        url: protocol::redact::redact_url(url),
        reason: e.to_string(),
    })?;
    Ok(info.redis_settings().db())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_url_is_a_single_server() {
        let t = RedisTarget::parse(" redis://127.0.0.1:6379/2 ").unwrap();
        assert_eq!(t, RedisTarget::Single("redis://127.0.0.1:6379/2".into()));
        assert!(!t.is_cluster());
        assert_eq!(t.urls(), ["redis://127.0.0.1:6379/2"]);
    }

    #[test]
    fn cluster_prefix_lists_seeds() {
        let t: RedisTarget = "cluster:redis://10.0.0.1:7000, redis://:pw@10.0.0.2:7001"
            .parse()
            .unwrap();
        assert!(t.is_cluster());
        assert_eq!(t.urls().len(), 2);
        assert_eq!(t.urls()[1], "redis://:pw@10.0.0.2:7001");
        assert!(!t.redacted().contains("pw"), "{}", t.redacted());
        assert!(!format!("{t:?}").contains("pw"));
        assert!(t.redacted().starts_with("cluster:redis://10.0.0.1:7000,"));
    }

    #[test]
    fn bad_targets_are_refused_with_their_reason() {
        assert_eq!(RedisTarget::parse("  "), Err(TargetError::Empty));
        assert_eq!(RedisTarget::parse("cluster:"), Err(TargetError::EmptySeed { index: 0 }));
        assert_eq!(
            RedisTarget::parse("cluster:redis://a:1,,redis://b:2"),
            Err(TargetError::EmptySeed { index: 1 })
        );
        let many = format!("cluster:{}", vec!["redis://a:1"; MAX_SEEDS + 1].join(","));
        assert_eq!(
            RedisTarget::parse(&many),
            Err(TargetError::TooManySeeds { count: MAX_SEEDS + 1 })
        );
        assert!(matches!(
            RedisTarget::parse("http://a:1"),
            Err(TargetError::InvalidUrl { .. })
        ));
        assert!(matches!(
            RedisTarget::parse("cluster:redis://:secret@a:1/3"),
            Err(TargetError::ClusterDatabase { db: 3, ref url }) if !url.contains("secret")
        ));
        assert!(matches!(
            RedisTarget::parse("cluster:rediss://a:1,redis://:pw@b:2"),
            Err(TargetError::MixedTls { ref url }) if url.starts_with("redis://") && !url.contains("pw")
        ));
        assert!(RedisTarget::parse("cluster:rediss://a:1,rediss://b:2").is_ok());
        assert_eq!(
            RedisTarget::parse(&format!("cluster:{}", vec!["redis://a:1"; MAX_SEEDS].join(",")))
                .map(|t| t.urls().len()),
            Ok(MAX_SEEDS)
        );
    }
}
