//! `MOVED` and `ASK`: a cluster node saying that another node serves a slot.

use redis::{RedisError, ServerErrorKind, Value};

use crate::topology::NodeAddr;

/// Which redirect a node answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedirectKind {
    /// `MOVED`: the slot belongs to the named node now (refresh the slot map, go there from now on).
    Moved,
    /// `ASK`: the slot is migrating and this key is already on the named node: send this one command there,
    /// preceded by `ASKING`, and keep the slot map as it is.
    Ask,
}

/// A `MOVED <slot> <host:port>` or `ASK <slot> <host:port>` answer. The command that got it did not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// `MOVED` or `ASK`.
    pub kind: RedirectKind,
    /// The slot the command's keys hash to.
    pub slot: u16,
    /// The node to send it to.
    pub to: NodeAddr,
}

impl Redirect {
    /// The redirect `error` carries, if it is one.
    pub fn from_error(error: &RedisError) -> Option<Self> {
        let kind = match error.kind() {
            redis::ErrorKind::Server(ServerErrorKind::Moved) => RedirectKind::Moved,
            redis::ErrorKind::Server(ServerErrorKind::Ask) => RedirectKind::Ask,
            _ => return None,
        };
        let (addr, slot) = error.redirect_node()?;
        Some(Redirect {
            kind,
            slot,
            to: NodeAddr::parse(addr)?,
        })
    }

    /// The redirect a pipeline reply is, if it is one.
    pub fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::ServerError(e) => Self::from_error(&RedisError::from(e.clone())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(text: &str) -> Value {
        redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap()
    }

    fn server_error(text: &str) -> RedisError {
        match reply(text) {
            Value::ServerError(e) => e.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn moved_and_ask_name_slot_and_node() {
        let moved = Redirect::from_error(&server_error("MOVED 3999 127.0.0.1:6381")).unwrap();
        assert_eq!(moved.kind, RedirectKind::Moved);
        assert_eq!(moved.slot, 3999);
        assert_eq!(moved.to, NodeAddr::new("127.0.0.1", 6381));
        let ask = Redirect::from_error(&server_error("ASK 12 10.1.2.3:7000")).unwrap();
        assert_eq!((ask.kind, ask.slot, ask.to.port), (RedirectKind::Ask, 12, 7000));
        assert_eq!(Redirect::from_value(&reply("ASK 12 10.1.2.3:7000")), Some(ask));
    }

    #[test]
    fn other_errors_are_not_redirects() {
        assert_eq!(Redirect::from_error(&server_error("TRYAGAIN Multiple keys")), None);
        let io = RedisError::from(std::io::Error::other("gone"));
        assert_eq!(Redirect::from_error(&io), None);
        assert_eq!(Redirect::from_value(&Value::Okay), None);
    }
}
