//! `CLUSTER NODES` answers parsed, and the part of them every node must agree on.

use std::collections::BTreeMap;

/// One node's entry in a `CLUSTER NODES` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    /// The node id.
    pub id: String,
    /// The client port.
    pub port: u16,
    /// Whether the node is a master.
    pub master: bool,
    /// The master's id, for a replica.
    pub replica_of: Option<String>,
    /// Whether the node is flagged `fail` or `fail?`.
    pub failing: bool,
    /// The slots it serves, as inclusive ranges (migration markers `[...]` left out).
    pub slots: Vec<(u16, u16)>,
}

/// The roles and slot map one node reports, without the parts that legitimately differ between nodes (failure
/// flags, link state, timestamps): what every node must agree on.
pub(super) type Agreed = BTreeMap<String, (bool, Option<String>, Vec<(u16, u16)>)>;

/// Parses a `CLUSTER NODES` answer; lines that do not parse are skipped.
pub fn parse_cluster_nodes(text: &str) -> Vec<NodeEntry> {
    text.lines().filter_map(parse_node_line).collect()
}

fn parse_node_line(line: &str) -> Option<NodeEntry> {
    let mut words = line.split_whitespace();
    let id = words.next()?.to_owned();
    let addr = words.next()?;
    let flags = words.next()?;
    let master_id = words.next()?;
    let _ping_sent = words.next()?;
    let _pong_recv = words.next()?;
    let _epoch = words.next()?;
    let _link = words.next()?;
    let host_port = addr.split('@').next()?;
    let port = host_port.rsplit(':').next()?.parse().ok()?;
    let flags: Vec<&str> = flags.split(',').collect();
    let mut slots = Vec::new();
    for word in words {
        if word.starts_with('[') {
            continue;
        }
        let range = match word.split_once('-') {
            Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
            None => {
                let s = word.parse().ok()?;
                (s, s)
            }
        };
        slots.push(range);
    }
    slots.sort_unstable();
    Some(NodeEntry {
        id,
        port,
        master: flags.contains(&"master"),
        replica_of: (master_id != "-").then(|| master_id.to_owned()),
        failing: flags.iter().any(|f| *f == "fail" || *f == "fail?"),
        slots,
    })
}

pub(super) fn agreed_view(entries: &[NodeEntry]) -> Agreed {
    entries
        .iter()
        .map(|e| (e.id.clone(), (e.master, e.replica_of.clone(), e.slots.clone())))
        .collect()
}
