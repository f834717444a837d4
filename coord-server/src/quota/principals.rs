//! Who a request speaks for: each distinct token of the configuration is one [`Principal`], with a name (never
//! the token), its quotas (the coordinator's defaults with the overrides of its token table lines) and its
//! request bucket on this replica.
//!
//! Built once from the configuration; a request's credential position (from [`crate::auth::authorize_as`])
//! finds its principal without comparing the token again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use super::bucket::Bucket;
use super::{Quota, QuotaOverrides};
use crate::auth::{Credentials, Role};
use crate::config::Config;

/// Name of the single admin token (`--admin-token`), which has no table line to name it.
pub const ADMIN_TOKEN_NAME: &str = "admin-token";
/// Name of the single client token (`--client-token`).
pub const CLIENT_TOKEN_NAME: &str = "client-token";
/// Longest token name.
pub const MAX_NAME_LEN: usize = 64;

/// A token name: 1 to [`MAX_NAME_LEN`] characters of `[A-Za-z0-9._-]` (it appears in metrics labels and HTML).
///
/// # Errors
/// A sentence naming the rule broken (without repeating the name: it may be half of a mistyped token).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "name= must be 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 . _ -"
        ))
    }
}

/// One token: its name, quotas and request bucket.
#[derive(Debug)]
pub struct Principal {
    /// The name shown for it (`name=`, else `token-N` by order in the table, or the single tokens' names).
    pub name: String,
    /// Its quotas.
    pub quota: Quota,
    /// Per replica: a process cannot share a bucket with another replica without a Redis round trip per request.
    bucket: Mutex<Bucket>,
}

impl Principal {
    fn new(name: String, quota: Quota) -> Self {
        let bucket = Bucket::new(quota.requests_per_second, quota.request_burst, Instant::now());
        Principal {
            name,
            quota,
            bucket: Mutex::new(bucket),
        }
    }

    /// Takes one request from the token's bucket.
    ///
    /// # Errors
    /// How long until the next request would be admitted.
    pub fn admit(&self) -> Result<(), Duration> {
        self.bucket.lock().expect("bucket lock").take(Instant::now())
    }

    /// Requests left in the bucket now.
    pub fn available(&self) -> u32 {
        self.bucket.lock().expect("bucket lock").available(Instant::now())
    }
}

/// Every token of a configuration.
#[derive(Debug, Default)]
pub struct Principals {
    list: Vec<Principal>,
    /// Position of a credential (in `Credentials` order) -> its principal in `list`.
    by_credential: Vec<usize>,
}

impl Principals {
    /// The principals of `config`: one per distinct token.
    ///
    /// # Errors
    /// Two lines of one token that set a quota or a name differently, two tokens with one name, or a quota that
    /// is zero or out of range.
    pub fn new(config: &Config) -> Result<Principals, String> {
        // (token, name, overrides), in order of first appearance.
        let mut tokens: Vec<(&str, Option<String>, QuotaOverrides)> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        let mut by_credential = Vec::new();
        let credentials = config.credentials();
        let table = config.tokens.iter().map(Some);
        let singles = [
            (config.admin_token.as_deref(), ADMIN_TOKEN_NAME),
            (config.client_token.as_deref(), CLIENT_TOKEN_NAME),
        ];
        let lines = table.chain(std::iter::repeat(None));
        for ((_, _, token), grant) in credentials.each().zip(lines) {
            let at = *index.entry(token).or_insert_with(|| {
                tokens.push((token, None, QuotaOverrides::default()));
                tokens.len() - 1
            });
            by_credential.push(at);
            let entry = &mut tokens[at];
            match grant {
                Some(grant) => {
                    entry.2.merge(&grant.quota).map_err(|e| format!("token table: {e}"))?;
                    if let Some(name) = &grant.name {
                        match &entry.1 {
                            Some(old) if old != name => {
                                return Err(format!("token table: one token is named both {old:?} and {name:?}"));
                            }
                            _ => entry.1 = Some(name.clone()),
                        }
                    }
                }
                None => {
                    let single = singles.iter().find(|(t, _)| *t == Some(token));
                    if let (None, Some((_, name))) = (&entry.1, single) {
                        entry.1 = Some((*name).to_owned());
                    }
                }
            }
        }
        let mut list: Vec<Principal> = Vec::with_capacity(tokens.len());
        for (i, (_, name, overrides)) in tokens.into_iter().enumerate() {
            let name = name.unwrap_or_else(|| format!("token-{}", i + 1));
            if list.iter().any(|p| p.name == name) {
                return Err(format!("token table: two tokens are named {name:?}"));
            }
            let quota = config.quota.with(&overrides);
            quota.validate().map_err(|e| format!("token {name}: {e}"))?;
            list.push(Principal::new(name, quota));
        }
        Ok(Principals { list, by_credential })
    }

    /// The most shards any credential may grow `stream` to: the largest shard quota of the admin grants that
    /// cover it (add-shards is an admin route), or `default`'s when none does (an open coordinator admits
    /// add-shards under the default quota). No growth a coordinator made can be above it, so a restoration above it
    /// is refused (`routing_section::restore`).
    pub fn growth_ceiling(&self, credentials: Credentials<'_>, default: &Quota, stream: &str) -> u32 {
        credentials
            .each()
            .enumerate()
            .filter(|(_, (role, scope, _))| *role == Role::Admin && scope.covers(stream))
            .filter_map(|(i, _)| self.by_credential.get(i).and_then(|&at| self.list.get(at)))
            .map(|p| p.quota.shards_per_group)
            .max()
            .unwrap_or(default.shards_per_group)
    }

    /// The principal of the credential at `position` (see [`crate::auth::authorize_as`]).
    pub fn get(&self, position: usize) -> Option<&Principal> {
        self.list.get(*self.by_credential.get(position)?)
    }

    /// Every principal, in table order.
    pub fn all(&self) -> &[Principal] {
        &self.list
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Grant;

    fn config(table: &str) -> Config {
        Config {
            tokens: Grant::parse_table(table).expect("table"),
            ..Config::default()
        }
    }

    #[test]
    fn each_token_is_one_principal_with_merged_quotas() {
        let mut c = config("admin:a.:ta name=tenant-a groups=5\nconsumer:a.:ca members=3\nproducer:a.:ca rate=7\n");
        c.admin_token = Some("root".into());
        let p = Principals::new(&c).expect("principals");
        let names: Vec<&str> = p.all().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["tenant-a", "token-2", ADMIN_TOKEN_NAME]);
        assert_eq!(p.get(0).unwrap().quota.groups, 5);
        let ca = p.get(2).unwrap();
        assert_eq!(ca.name, "token-2");
        assert_eq!((ca.quota.members_per_group, ca.quota.requests_per_second), (3, 7));
        assert_eq!(ca.quota.groups, Quota::default().groups, "unset: the default");
        assert_eq!(p.get(3).unwrap().name, ADMIN_TOKEN_NAME);
        assert!(p.get(4).is_none());
    }

    #[test]
    fn conflicting_lines_and_names_are_refused() {
        for bad in [
            "admin:a.:t groups=1\nconsumer:a.:t groups=2",
            "admin:a.:t name=x\nconsumer:a.:t name=y",
            "admin:a.:t name=x\nconsumer:a.:u name=x",
            "admin:a.:t shards=70000",
        ] {
            assert!(Principals::new(&config(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_bucket_admits_the_burst_then_refuses() {
        let mut c = config("consumer:*:t rate=1 burst=2");
        c.quota = Quota::default();
        let p = Principals::new(&c).expect("principals");
        let t = p.get(0).unwrap();
        assert!(t.admit().is_ok() && t.admit().is_ok());
        let wait = t.admit().expect_err("burst spent");
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
    }
}
