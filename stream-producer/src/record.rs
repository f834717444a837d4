//! [`Record`]: what a caller publishes, an optional routing key and the entry's fields. The lowest module of the
//! publish path: the publisher, the write paths and the publish script all take records, and none of them is
//! needed to build one.

use crate::error::PublishError;

/// One record to publish: an optional routing key and the entry's fields.
///
/// The key only chooses the shard; it is not written into the entry. Put it in a field too if consumers need it.
///
/// ```
/// use stream_producer::Record;
///
/// let r = Record::with_key("customer-42").field("type", "order-created").field("amount", "12.50");
/// assert_eq!(r.key(), Some(&b"customer-42"[..]));
/// let keyless = Record::without_key().field("ping", "1");
/// assert!(keyless.key().is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    key: Option<Vec<u8>>,
    fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Record {
    /// A record routed by `key`.
    pub fn with_key(key: impl Into<Vec<u8>>) -> Self {
        Record {
            key: Some(key.into()),
            fields: Vec::new(),
        }
    }

    /// A record without a key (routed round-robin).
    pub fn without_key() -> Self {
        Record::default()
    }

    /// A record from a key and fields.
    pub fn new<N, V>(key: Option<Vec<u8>>, fields: impl IntoIterator<Item = (N, V)>) -> Self
    where
        N: Into<Vec<u8>>,
        V: Into<Vec<u8>>,
    {
        Record {
            key,
            fields: fields.into_iter().map(|(n, v)| (n.into(), v.into())).collect(),
        }
    }

    /// Adds a field.
    pub fn field(mut self, name: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        self.fields.push((name.into(), value.into()));
        self
    }

    /// The routing key.
    pub fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    /// The fields, in order.
    pub fn fields(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.fields
    }

    /// Bytes of the key, field names and values (what the batching mode's in-flight budget counts).
    pub(crate) fn payload_len(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len) + self.fields.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>()
    }

    pub(crate) fn check(&self) -> Result<(), PublishError> {
        if self.fields.is_empty() {
            return Err(PublishError::InvalidRecord("a stream entry needs at least one field"));
        }
        Ok(())
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_need_a_field() {
        assert!(Record::with_key("a").check().is_err());
        assert!(Record::with_key("a").field("f", "").check().is_ok());
    }
}
