//! Bearer tokens: which role a token holds and which streams it reaches.
//!
//! A [`Grant`] gives one token one [`Role`] on the streams whose name starts with a prefix (or on every stream).
//! A token may appear in several grants (a client that consumes and produces, an operator of two tenants); its
//! rights are their union. The single-token settings of older versions ([`Credentials::admin_token`],
//! [`Credentials::client_token`]) are grants on every stream: admin, and consumer plus producer.
//!
//! A route is open (no token needed) only while nothing could authorise it: no token table and no single token of
//! its kind. Once a table is configured every route but the probes and `/metrics` needs a token.
//!
//! Tokens are compared in constant time ([`token_eq`]), against every credential (no early exit), so neither
//! the timing of a refusal nor of a success tells which credential, or which prefix of one, a guess matched.

use std::fmt;

use crate::quota::{QuotaOverrides, ATTRIBUTES};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The admin endpoints: create, describe, recreate, fence, add shards, list.
    Admin,
    /// Consumer heartbeats (join, heartbeat, leave).
    Consumer,
    /// The producers' routing fetch.
    Producer,
}

impl Role {
    /// The name used in token tables and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Consumer => "consumer",
            Role::Producer => "producer",
        }
    }

    fn parse(text: &str) -> Result<Role, String> {
        match text {
            "admin" => Ok(Role::Admin),
            "consumer" => Ok(Role::Consumer),
            "producer" => Ok(Role::Producer),
            other => Err(format!("unknown role {other:?} (expected admin, consumer or producer)")),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The streams a grant reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamScope {
    /// Every stream (`*` in a token table; the single-token settings).
    All,
    /// The streams whose name starts with this prefix. End it with a separator (`tenant-a.`): `tenant-a`
    /// would also cover `tenant-ab`.
    Prefix(String),
}

impl StreamScope {
    /// Parses `*` or a prefix made of the characters a stream name may hold.
    ///
    /// # Errors
    /// A sentence naming the rule broken.
    pub fn parse(text: &str) -> Result<StreamScope, String> {
        if text == "*" {
            return Ok(StreamScope::All);
        }
        if text.is_empty() {
            return Err("empty stream prefix (use * for every stream)".into());
        }
        if text.len() > protocol::names::MAX_NAME_LEN {
            return Err(format!(
                "stream prefix is longer than {} bytes",
                protocol::names::MAX_NAME_LEN
            ));
        }
        if let Some(c) = text
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(format!("stream prefix {text:?} holds {c:?}, which no stream name can"));
        }
        Ok(StreamScope::Prefix(text.to_owned()))
    }

    /// Whether `stream` is in scope (a plain byte-prefix test: names are ASCII).
    pub fn covers(&self, stream: &str) -> bool {
        match self {
            StreamScope::All => true,
            StreamScope::Prefix(prefix) => stream.starts_with(prefix.as_str()),
        }
    }
}

impl fmt::Display for StreamScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamScope::All => f.write_str("*"),
            StreamScope::Prefix(p) => f.write_str(p),
        }
    }
}

/// One line of the token table: a token, its role and its streams. `Debug` never shows the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Grant {
    /// What the token may do.
    pub role: Role,
    /// Where.
    pub scope: StreamScope,
    /// The token's name (`name=`), shown where the token never may be: /status, coordctl, metrics, logs.
    pub name: Option<String>,
    /// The token's quotas that this line sets (see [`crate::quota`]).
    pub quota: QuotaOverrides,
    token: String,
}

impl Grant {
    /// A grant of `role` on `scope` to `token`.
    ///
    /// # Errors
    /// A token that is empty or holds a character a header value cannot carry unchanged (space, control,
    /// non-ASCII).
    pub fn new(role: Role, scope: StreamScope, token: impl Into<String>) -> Result<Grant, String> {
        let token = token.into();
        check_token(&token)?;
        Ok(Grant {
            role,
            scope,
            name: None,
            quota: QuotaOverrides::default(),
            token,
        })
    }

    /// Parses a token table: one grant per line, `role:prefix:token` (the token is everything after the second
    /// `:` up to the first space), `*` as prefix for every stream, then optionally the token's name and quotas as
    /// space-separated `key=value` attributes (`name=tenant-a groups=20 rate=200`, see [`crate::quota`]); blank
    /// lines and lines starting with `#` are skipped.
    ///
    /// # Errors
    /// The line number and the rule broken; the token itself is never repeated in the message.
    pub fn parse_table(text: &str) -> Result<Vec<Grant>, String> {
        let mut grants = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = |e: String| format!("token table line {}: {e}", i + 1);
            // A token holds no whitespace, so whatever follows the first run of it is attributes.
            let (spec, attributes) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let mut parts = spec.splitn(3, ':');
            let (Some(role), Some(scope), Some(token)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(at("expected role:prefix:token".into()));
            };
            let mut grant = Grant::new(
                Role::parse(role).map_err(at)?,
                StreamScope::parse(scope).map_err(at)?,
                token,
            )
            .map_err(at)?;
            grant.read_attributes(attributes).map_err(at)?;
            grants.push(grant);
        }
        Ok(grants)
    }
}

impl Grant {
    /// Reads the `key=value` attributes after a line's token. Errors never repeat what they refuse: a space inside
    /// a token would make its second half look like an attribute.
    fn read_attributes(&mut self, text: &str) -> Result<(), String> {
        for attribute in text.split_whitespace() {
            let Some((key, value)) = attribute.split_once('=') else {
                return Err(format!(
                    "after the token only key=value attributes may follow ({ATTRIBUTES}); a token holds no spaces"
                ));
            };
            if key == "name" {
                crate::quota::principals::check_name(value)?;
                if self.name.replace(value.to_owned()).is_some() {
                    return Err("name= is given twice".into());
                }
            } else if !self.quota.set(key, value)? {
                return Err(format!("unknown attribute (expected one of {ATTRIBUTES})"));
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("role", &self.role)
            .field("scope", &self.scope)
            .field("name", &self.name)
            .field("quota", &self.quota)
            .field("token", &"***")
            .finish()
    }
}

/// Tokens travel in a header and are compared byte for byte after trimming: refuse what could never match.
pub(crate) fn check_token(token: &str) -> Result<(), String> {
    if token.is_empty() {
        return Err("empty token".into());
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("a token may hold only visible ASCII characters (no spaces)".into());
    }
    Ok(())
}

/// Equality of a presented token with a configured one in time that depends only on the presented token's
/// length (which its sender knows), never on the configured token's length or content.
pub fn token_eq(presented: &[u8], expected: &[u8]) -> bool {
    if expected.is_empty() {
        return false;
    }
    // Lengths differ => nonzero; then every presented byte is compared (cycling over the expected bytes), with no
    // branch on the data, so a wrong length costs the same as a wrong last byte.
    let mut diff = presented.len() ^ expected.len();
    for (i, &b) in presented.iter().enumerate() {
        diff |= usize::from(b ^ expected[i % expected.len()]);
    }
    std::hint::black_box(diff) == 0
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer <token>` header (401).
    Missing {
        /// The role the route needs.
        role: Role,
    },
    /// A token that matches no credential (401).
    Invalid,
    /// A valid token without the role the route needs (403).
    WrongRole {
        /// The role the route needs.
        role: Role,
    },
    /// A valid token whose grants of this role do not cover the stream (403).
    OutOfScope {
        /// The role the route needs.
        role: Role,
        /// The stream asked for.
        stream: String,
    },
    /// A valid token whose grants of this role do not cover every stream, for an operation that spans them
    /// (403).
    NeedsAllStreams {
        /// The role the route needs.
        role: Role,
    },
}

impl Denied {
    /// Whether the caller is unknown (401) rather than known but not allowed (403).
    pub fn is_unauthenticated(&self) -> bool {
        matches!(self, Denied::Missing { .. } | Denied::Invalid)
    }
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denied::Missing { role } => {
                write!(
                    f,
                    "this endpoint requires Authorization: Bearer <token with the {role} role>"
                )
            }
            Denied::Invalid => f.write_str("the bearer token is not valid"),
            Denied::WrongRole { role } => write!(f, "the bearer token does not have the {role} role"),
            Denied::OutOfScope { role, stream } => {
                write!(f, "the bearer token's {role} role does not cover stream {stream:?}")
            }
            Denied::NeedsAllStreams { role } => write!(
                f,
                "this operation spans every stream and needs a token with the {role} role on every stream (*)"
            ),
        }
    }
}

/// What an authorised request may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Nothing could authorise the route: it is open (see the module docs).
    Open,
    /// The scopes of the token's grants of the route's role (at least one).
    Scoped(Vec<StreamScope>),
}

impl Access {
    /// Whether `stream` may be reached.
    pub fn covers(&self, stream: &str) -> bool {
        match self {
            Access::Open => true,
            Access::Scoped(scopes) => scopes.iter().any(|s| s.covers(stream)),
        }
    }

    /// Whether every stream may be reached (needed for what spans tenants, such as rebuilding the index).
    pub fn covers_all(&self) -> bool {
        match self {
            Access::Open => true,
            Access::Scoped(scopes) => scopes.contains(&StreamScope::All),
        }
    }
}

/// Every credential a coordinator accepts, borrowed from its configuration (`Config::credentials`).
#[derive(Clone, Copy, Default)]
pub struct Credentials<'a> {
    /// The token table.
    pub tokens: &'a [Grant],
    /// The single admin token: an admin grant on every stream.
    pub admin_token: Option<&'a str>,
    /// The single client token: consumer and producer grants on every stream.
    pub client_token: Option<&'a str>,
}

impl fmt::Debug for Credentials<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = |t: Option<&str>| t.map(|_| "<hidden>");
        f.debug_struct("Credentials")
            .field("tokens", &self.tokens)
            .field("admin_token", &hidden(self.admin_token))
            .field("client_token", &hidden(self.client_token))
            .finish()
    }
}

impl<'a> Credentials<'a> {
    /// Every credential as (role, scope, token): the table, then the single-token settings.
    pub(crate) fn each(self) -> impl Iterator<Item = (Role, &'a StreamScope, &'a str)> {
        const ALL: &StreamScope = &StreamScope::All;
        let table = self.tokens.iter().map(|g| (g.role, &g.scope, g.token.as_str()));
        let admin = self.admin_token.into_iter().map(|t| (Role::Admin, ALL, t));
        let client = self
            .client_token
            .into_iter()
            .flat_map(|t| [(Role::Consumer, ALL, t), (Role::Producer, ALL, t)]);
        table.chain(admin).chain(client)
    }
}

/// Whether any credential can authorise `role`: the table is non-empty, or the single token of its kind is set.
pub fn role_is_protected(credentials: Credentials<'_>, role: Role) -> bool {
    !credentials.tokens.is_empty()
        || match role {
            Role::Admin => credentials.admin_token.is_some(),
            Role::Consumer | Role::Producer => credentials.client_token.is_some(),
        }
}

/// The token of an `Authorization` header value: the `Bearer` scheme, matched case-insensitively (RFC 9110
/// §11.1), then one or more spaces.
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, rest) = header.trim_start().split_once([' ', '\t'])?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = rest.trim();
    (!token.is_empty()).then_some(token)
}

/// Decides a request for `role` with the `Authorization` header value `header` (`None` when absent or not
/// visible ASCII).
///
/// # Errors
/// [`Denied`]: missing or invalid token, or a token without `role`.
pub fn authorize(credentials: Credentials<'_>, header: Option<&str>, role: Role) -> Result<Access, Denied> {
    authorize_as(credentials, header, role).map(|(access, _)| access)
}

/// [`authorize`], also naming which credential the token is: the position of the first credential equal to it
/// in [`Credentials`] order (the table, then the admin token, then the client token as consumer and producer);
/// `None` for an open route. [`crate::quota::principals`] maps it to the token's name and quotas.
///
/// # Errors
/// As [`authorize`].
pub fn authorize_as(
    credentials: Credentials<'_>,
    header: Option<&str>,
    role: Role,
) -> Result<(Access, Option<usize>), Denied> {
    if !role_is_protected(credentials, role) {
        return Ok((Access::Open, None));
    }
    let presented = header.and_then(bearer_token).ok_or(Denied::Missing { role })?;
    let mut known = None;
    let mut scopes = Vec::new();
    // Every credential is compared, whatever matched before.
    for (i, (grant_role, scope, token)) in credentials.each().enumerate() {
        let equal = token_eq(presented.as_bytes(), token.as_bytes());
        if equal && known.is_none() {
            known = Some(i);
        }
        if equal && grant_role == role {
            scopes.push(scope.clone());
        }
    }
    let Some(credential) = known else {
        return Err(Denied::Invalid);
    };
    if scopes.is_empty() {
        return Err(Denied::WrongRole { role });
    }
    Ok((Access::Scoped(scopes), Some(credential)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(table: &str) -> Vec<Grant> {
        Grant::parse_table(table).expect("table")
    }

    #[test]
    fn token_comparison_needs_equal_length_and_bytes() {
        assert!(token_eq(b"secret", b"secret"));
        assert!(!token_eq(b"secret", b"secreT"));
        assert!(!token_eq(b"secret", b"secret2"));
        assert!(
            !token_eq(b"secretsecret", b"secret"),
            "a repeated token is not the token"
        );
        assert!(!token_eq(b"", b"secret"));
        assert!(!token_eq(b"", b""));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer   "), None);
        assert_eq!(bearer_token("Bearerabc"), None);
    }

    #[test]
    fn table_lines_parse_and_errors_never_echo_the_token() {
        let grants = Grant::parse_table(
            "# tenant a\nadmin:tenant-a.:tok-a\n\nconsumer:*:tok:with:colons\n  producer:tenant-b.:tok-b  \n",
        )
        .expect("table");
        assert_eq!(grants.len(), 3);
        assert_eq!(grants[1].scope, StreamScope::All);
        assert_eq!(grants[1].token, "tok:with:colons");
        let debug = format!("{grants:?}");
        assert!(!debug.contains("tok-") && !debug.contains("colons"), "{debug}");
        for bad in [
            "reader:*:hunter2",
            "admin::hunter2",
            "admin:a{b:hunter2",
            "admin:*:",
            "admin:*",
            "admin:*:hun ter2",
        ] {
            let err = Grant::parse_table(bad).expect_err(bad);
            assert!(err.contains("line 1"), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn attributes_after_the_token_set_its_name_and_quotas() {
        let grants =
            table("admin:tenant-a.:ta name=tenant-a groups=3 shards=64\nconsumer:tenant-a.:ca members=8 rate=20");
        assert_eq!(grants[0].token, "ta");
        assert_eq!(grants[0].name.as_deref(), Some("tenant-a"));
        assert_eq!(grants[0].quota.groups, Some(3));
        assert_eq!(grants[0].quota.shards_per_group, Some(64));
        assert_eq!(grants[1].quota.members_per_group, Some(8));
        assert_eq!(grants[1].quota.requests_per_second, Some(20));
        for bad in [
            "admin:*:hunter2 groups=0",
            "admin:*:hunter2 colour=red",
            "admin:*:hunter2 name=a name=b",
            "admin:*:hunter2 name=bad/name",
            "admin:*:hunter2 rate",
        ] {
            let err = Grant::parse_table(bad).expect_err(bad);
            assert!(err.contains("line 1") && !err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn authorize_as_names_the_first_credential_of_the_token() {
        let grants = table("admin:a.:one\nconsumer:a.:two\nconsumer:b.:one");
        let config = Credentials {
            tokens: &grants,
            client_token: Some("three"),
            ..Credentials::default()
        };
        let (_, who) = authorize_as(config, Some("Bearer one"), Role::Consumer).expect("one");
        assert_eq!(who, Some(0), "the token's first line, whichever role matched");
        let (_, who) = authorize_as(config, Some("Bearer three"), Role::Producer).expect("three");
        assert_eq!(who, Some(3));
        let open = Credentials::default();
        assert_eq!(authorize_as(open, None, Role::Admin), Ok((Access::Open, None)));
    }

    #[test]
    fn grants_are_scoped_by_role_and_prefix() {
        let grants = table("admin:tenant-a.:ta\nconsumer:tenant-a.:ca\nconsumer:tenant-b.:cb\nproducer:tenant-a.:ca");
        let config = Credentials {
            tokens: &grants,
            ..Credentials::default()
        };
        let a = authorize(config, Some("Bearer ca"), Role::Consumer).expect("consumer a");
        assert!(a.covers("tenant-a.orders"));
        assert!(!a.covers("tenant-b.orders"));
        assert!(authorize(config, Some("Bearer ca"), Role::Producer).is_ok());
        assert_eq!(
            authorize(config, Some("Bearer cb"), Role::Producer),
            Err(Denied::WrongRole { role: Role::Producer })
        );
        assert_eq!(
            authorize(config, Some("Bearer cx"), Role::Consumer),
            Err(Denied::Invalid)
        );
        assert_eq!(
            authorize(config, None, Role::Admin),
            Err(Denied::Missing { role: Role::Admin })
        );
        let admin = authorize(config, Some("Bearer ta"), Role::Admin).expect("admin a");
        assert!(!admin.covers_all());
    }

    #[test]
    fn single_tokens_keep_their_old_meaning() {
        let mut config = Credentials::default();
        assert_eq!(authorize(config, None, Role::Admin), Ok(Access::Open));
        config.client_token = Some("c");
        assert_eq!(
            authorize(config, None, Role::Admin),
            Ok(Access::Open),
            "admin stays open"
        );
        assert!(authorize(config, Some("Bearer c"), Role::Consumer).is_ok_and(|a| a.covers_all()));
        assert!(authorize(config, Some("Bearer c"), Role::Producer).is_ok());
        assert!(!role_is_protected(config, Role::Admin));
        config.admin_token = Some("a");
        assert!(role_is_protected(config, Role::Admin));
        assert_eq!(
            authorize(config, Some("Bearer a"), Role::Consumer),
            Err(Denied::WrongRole { role: Role::Consumer })
        );
    }
}
