//! The record a stall-test worker process (`src/bin/stall_worker.rs`) writes for every handler invocation, one
//! line per event, appended to its own file; read back by `tests/stalls.rs`.
//!
//! Times are wall-clock microseconds since the Unix epoch: the worker processes and the test share the
//! machine's clock, and a stopped process cannot be asked for anything while it is stopped.
//!
//! Line format, space separated:
//! `<kind> <pid> <member> <shard> <entry id> <token> <start µs> <at µs> <lease end µs or ->`, where `kind` is `S`
//! (handler started; `at` = start), `E` (handler returned `Ok`: completed) or `D` (its future was dropped
//! unfinished). `token` is the shard's fencing token the message carried ([`stream_consumer::Message::fencing_token`]):
//! tests compare the tokens of different processes. `lease end` is the member's assignment-lease end as its
//! consumer knew it at `at` (inside the handler: [`stream_consumer::lease_deadline`]).

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use stream_consumer::EntryId;

/// What happened to a handler invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// It started.
    Start,
    /// It returned `Ok`.
    End,
    /// Its future was dropped before it finished.
    Dropped,
}

/// One line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The event.
    pub kind: Kind,
    /// The worker process.
    pub pid: u32,
    /// Its member id.
    pub member: String,
    /// The shard.
    pub shard: u32,
    /// The entry.
    pub entry: EntryId,
    /// The shard's fencing token the message carried.
    pub token: u64,
    /// When the handler started (µs).
    pub start_us: u64,
    /// When this event happened (µs).
    pub at_us: u64,
    /// The lease end the consumer knew at `at_us` (µs), if any.
    pub lease_end_us: Option<u64>,
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Start => "S",
            Kind::End => "E",
            Kind::Dropped => "D",
        };
        write!(
            f,
            "{kind} {} {} {} {} {} {} {} ",
            self.pid, self.member, self.shard, self.entry, self.token, self.start_us, self.at_us
        )?;
        match self.lease_end_us {
            Some(us) => write!(f, "{us}"),
            None => f.write_str("-"),
        }
    }
}

impl Record {
    /// Parses one line; `None` for anything else (a line cut by a kill).
    pub fn parse(line: &str) -> Option<Record> {
        let mut p = line.split(' ');
        let kind = match p.next()? {
            "S" => Kind::Start,
            "E" => Kind::End,
            "D" => Kind::Dropped,
            _ => return None,
        };
        let record = Record {
            kind,
            pid: p.next()?.parse().ok()?,
            member: p.next()?.to_owned(),
            shard: p.next()?.parse().ok()?,
            entry: p.next()?.parse().ok()?,
            token: p.next()?.parse().ok()?,
            start_us: p.next()?.parse().ok()?,
            at_us: p.next()?.parse().ok()?,
            lease_end_us: match p.next()? {
                "-" => None,
                us => Some(us.parse().ok()?),
            },
        };
        p.next().is_none().then_some(record)
    }
}

/// Now, in wall-clock microseconds.
pub fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A monotonic instant as wall-clock microseconds (through the current offset between the two clocks).
pub fn instant_as_wall_us(at: Instant) -> u64 {
    let (now, wall) = (Instant::now(), wall_us());
    if at >= now {
        wall.saturating_add(u64::try_from((at - now).as_micros()).unwrap_or(u64::MAX))
    } else {
        wall.saturating_sub(u64::try_from((now - at).as_micros()).unwrap_or(u64::MAX))
    }
}

/// Wall-clock microseconds as an instant of this process (for [`crate::History`]).
pub fn wall_us_as_instant(us: u64) -> Instant {
    let (now, wall) = (Instant::now(), wall_us());
    if us >= wall {
        now + Duration::from_micros(us - wall)
    } else {
        now.checked_sub(Duration::from_micros(wall - us)).unwrap_or(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let r = Record {
            kind: Kind::End,
            pid: 42,
            member: "w1".into(),
            shard: 3,
            entry: EntryId { ms: 17, seq: 2 },
            token: 1_700_000_000_123,
            start_us: 100,
            at_us: 250,
            lease_end_us: Some(300),
        };
        assert_eq!(Record::parse(&r.to_string()), Some(r.clone()));
        let none = Record {
            lease_end_us: None,
            kind: Kind::Dropped,
            ..r
        };
        assert_eq!(Record::parse(&none.to_string()), Some(none));
        assert_eq!(Record::parse("E 42 w1 3 17-2 9 100"), None, "a cut line");
    }
}
