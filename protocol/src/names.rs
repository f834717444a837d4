//! Validated names: stream prefixes, consumer groups and member ids.
//!
//! Names are embedded in Redis keys inside hash tags (`{stream:group}`), so braces and the `:` separator are
//! refused: they would let two different (stream, group) pairs build the same key or split a hash tag.

use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;

use crate::error::NameError;

/// Longest accepted name, in bytes.
pub const MAX_NAME_LEN: usize = 128;

fn validate(kind: &'static str, value: &str) -> Result<(), NameError> {
    if value.is_empty() {
        return Err(NameError::Empty { kind });
    }
    if value.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong {
            kind,
            len: value.len(),
            max: MAX_NAME_LEN,
        });
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(NameError::InvalidChar {
            kind,
            value: value.to_owned(),
            found: c,
        });
    }
    Ok(())
}

macro_rules! name {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Validates `value`: 1 to 128 bytes of ASCII letters, digits, `-`, `_` or `.`.
            ///
            /// # Errors
            /// [`NameError`] naming the rule that failed.
            pub fn new(value: impl Into<String>) -> Result<Self, NameError> {
                let value = value.into();
                validate($kind, &value)?;
                Ok(Self(value))
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::new(s)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

name!(
    /// The prefix of a logical stream; its shards are Redis stream keys built from it (see [`crate::keys`]).
    ///
    /// ```
    /// use protocol::names::StreamName;
    ///
    /// let stream = StreamName::new("orders")?;
    /// assert_eq!(stream.as_str(), "orders");
    /// assert!(StreamName::new("orders/eu").is_err(), "`/` separates names in keys");
    /// # Ok::<(), protocol::NameError>(())
    /// ```
    StreamName,
    "stream"
);
name!(
    /// A consumer group reading one logical stream.
    ///
    /// ```
    /// use protocol::names::GroupName;
    ///
    /// let group: GroupName = "billing".parse()?;
    /// assert_eq!(group.to_string(), "billing");
    /// # Ok::<(), protocol::NameError>(())
    /// ```
    GroupName,
    "group"
);
name!(
    /// A consumer's identity in a group; also its Redis consumer name on every shard stream.
    ///
    /// ```
    /// use protocol::names::MemberId;
    ///
    /// // One id per process, stable across its restarts (a pod name, say).
    /// let member = MemberId::new("billing-worker-1")?;
    /// assert_eq!(member.as_str(), "billing-worker-1");
    /// assert!(MemberId::new("").is_err());
    /// # Ok::<(), protocol::NameError>(())
    /// ```
    MemberId,
    "member id"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names() {
        assert_eq!(StreamName::new("orders.v1").unwrap().as_str(), "orders.v1");
        assert!(MemberId::new("worker-1_a").is_ok());
    }

    #[test]
    fn refuses_hash_tag_and_separator_chars() {
        for bad in ["a{b", "a}b", "a:b", "a b", "ü"] {
            assert!(
                matches!(StreamName::new(bad), Err(NameError::InvalidChar { .. })),
                "{bad}"
            );
        }
        assert!(matches!(GroupName::new(""), Err(NameError::Empty { .. })));
        assert!(matches!(MemberId::new("x".repeat(129)), Err(NameError::TooLong { .. })));
    }

    #[test]
    fn deserialize_validates() {
        assert!(serde_json::from_str::<GroupName>("\"g:1\"").is_err());
        assert_eq!(serde_json::from_str::<GroupName>("\"g1\"").unwrap().as_str(), "g1");
    }
}
