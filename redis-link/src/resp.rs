//! RESP2 written and read by hand, for the hot paths that send thousands of commands per pipeline.
//!
//! redis-rs builds a `Cmd` (two heap buffers) per command, copies it again into the pipeline's buffer, and parses
//! every reply through a general combinator parser; on the producer's publish path that was most of its client
//! CPU per record (issue 17). Here a command is written straight into the caller's buffer, and replies are read
//! by a small parser into redis-rs's own [`Value`], so what the rest of the code sees does not change. Error
//! replies (rare) are handed to redis-rs's parser, so their [`redis::ErrorKind`] is exactly the one redis-rs
//! gives (`NOSCRIPT`, `MOVED`, `EXECABORT`...).
//!
//! Every length a server sends is bounded before anything is allocated for it (a broken or hostile server cannot
//! make the client reserve gigabytes), and nesting is bounded too.

use redis::Value;

/// The longest bulk string accepted: Redis's own `proto-max-bulk-len` default.
pub const MAX_BULK_LEN: usize = 512 * 1024 * 1024;
/// The longest status or error line accepted.
const MAX_LINE_LEN: usize = 64 * 1024;
/// The most elements an array may announce (a reply's count, not its size; see [`MAX_PREALLOCATED`]).
const MAX_ARRAY_LEN: usize = 1 << 28;
/// Elements reserved up front for an announced array; the rest grows as elements actually arrive.
const MAX_PREALLOCATED: usize = 4096;
/// Deepest nesting of arrays accepted (redis-rs's bound too).
const MAX_DEPTH: usize = 100;

/// Appends the header of a command of `args` arguments (the command name counts).
pub fn write_command(buf: &mut Vec<u8>, args: usize) {
    buf.push(b'*');
    write_decimal(buf, args as u64);
    buf.extend_from_slice(b"\r\n");
}

/// Appends one argument of a command.
pub fn write_arg(buf: &mut Vec<u8>, arg: &[u8]) {
    buf.push(b'$');
    write_decimal(buf, arg.len() as u64);
    buf.extend_from_slice(b"\r\n");
    buf.extend_from_slice(arg);
    buf.extend_from_slice(b"\r\n");
}

/// Appends one integer argument of a command.
pub fn write_int_arg(buf: &mut Vec<u8>, n: u64) {
    write_arg(buf, Decimal::new(n).as_bytes());
}

/// A number as the decimal digits of a command argument, without allocating.
#[derive(Debug, Clone, Copy)]
pub struct Decimal {
    digits: [u8; 20],
    len: usize,
}

impl Decimal {
    /// The digits of `n`.
    pub fn new(n: u64) -> Self {
        let mut digits = [0u8; 20];
        let len = decimal(&mut digits, n);
        Decimal { digits, len }
    }

    /// The digits.
    pub fn as_bytes(&self) -> &[u8] {
        &self.digits[self.digits.len() - self.len..]
    }
}

/// Bytes [`write_arg`] appends for an argument of `len` bytes.
pub fn arg_len(len: usize) -> usize {
    1 + decimal_len(len as u64) + 2 + len + 2
}

fn write_decimal(buf: &mut Vec<u8>, n: u64) {
    // Most lengths in a command are short: no division loop for them.
    match n {
        0..=9 => buf.push(b'0' + n as u8),
        10..=99 => buf.extend_from_slice(&[b'0' + (n / 10) as u8, b'0' + (n % 10) as u8]),
        _ => buf.extend_from_slice(Decimal::new(n).as_bytes()),
    }
}

/// Writes `n` right-aligned into `digits`; returns how many digits.
fn decimal(digits: &mut [u8; 20], mut n: u64) -> usize {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return digits.len() - at;
        }
    }
}

fn decimal_len(mut n: u64) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// Why bytes from the server are not a reply this parser accepts. The connection cannot be used after it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed reply from Redis: {0}")]
pub struct ProtocolError(pub String);

fn malformed(detail: impl Into<String>) -> ProtocolError {
    ProtocolError(detail.into())
}

/// Parses the first reply in `buf`: `Ok(None)` when `buf` does not hold all of it yet, else the reply and how
/// many bytes it took.
///
/// # Errors
/// Bytes that are not a RESP2 reply, or a length beyond the bounds above.
pub fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, ProtocolError> {
    parse_at(buf, 0, 0)
}

/// The position just past the `\r\n` ending the line that starts at `from`, and the line's end.
fn line(buf: &[u8], from: usize) -> Result<Option<(usize, usize)>, ProtocolError> {
    let rest = &buf[from..];
    match rest.iter().position(|&b| b == b'\r') {
        Some(cr) if cr > MAX_LINE_LEN => Err(malformed("a line longer than 64 KiB")),
        Some(cr) => match rest.get(cr + 1) {
            None => Ok(None),
            Some(b'\n') => Ok(Some((from + cr, from + cr + 2))),
            Some(_) => Err(malformed("a carriage return without a line feed")),
        },
        None if rest.len() > MAX_LINE_LEN => Err(malformed("a line longer than 64 KiB")),
        None => Ok(None),
    }
}

fn integer(digits: &[u8]) -> Result<i64, ProtocolError> {
    let (negative, magnitude_digits) = match digits {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, digits),
    };
    let not_integer = || {
        malformed(format!(
            "not an integer: {:?}",
            String::from_utf8_lossy(&digits[..digits.len().min(24)])
        ))
    };
    // One pass, every length header of every reply goes through here. At most 19 digits: below 2^64, no overflow.
    if magnitude_digits.is_empty() || magnitude_digits.len() > 19 {
        return Err(not_integer());
    }
    let mut n: u64 = 0;
    for &d in magnitude_digits {
        let digit = d.wrapping_sub(b'0');
        if digit > 9 {
            return Err(not_integer());
        }
        n = n * 10 + u64::from(digit);
    }
    let magnitude = i64::try_from(n).map_err(|_| malformed("an integer out of range"))?;
    Ok(if negative { -magnitude } else { magnitude })
}

/// A length announced by `$` or `*`: -1 (nil) or 0..=`max`.
fn length(digits: &[u8], max: usize) -> Result<Option<usize>, ProtocolError> {
    match integer(digits)? {
        -1 => Ok(None),
        n if n >= 0 && (n as u64) <= max as u64 => Ok(Some(n as usize)),
        n => Err(malformed(format!("a length of {n}"))),
    }
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Value, usize)>, ProtocolError> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some((end, next)) = line(buf, at + 1)? else {
        return Ok(None);
    };
    let body = &buf[at + 1..end];
    let value = match kind {
        b'+' if matches!(body, [b'O', b'K']) => Value::Okay,
        b'+' => Value::SimpleString(
            std::str::from_utf8(body)
                .map_err(|_| malformed("a status that is not UTF-8"))?
                .to_owned(),
        ),
        // redis-rs's parser reads the error line, so the error kind is the one redis-rs callers expect.
        b'-' => match redis::parse_redis_value(&buf[at..next]) {
            Ok(v @ Value::ServerError(_)) => v,
            _ => return Err(malformed("an error line redis-rs cannot read")),
        },
        b':' => Value::Int(integer(body)?),
        b'$' => match length(body, MAX_BULK_LEN)? {
            None => Value::Nil,
            Some(len) => {
                return Ok(
                    bulk_end(buf, next, len)?.map(|end| (Value::BulkString(buf[next..next + len].to_vec()), end))
                );
            }
        },
        b'*' => match length(body, MAX_ARRAY_LEN)? {
            None => Value::Nil,
            Some(len) => {
                if depth >= MAX_DEPTH {
                    return Err(malformed("arrays nested too deep"));
                }
                let mut items = Vec::with_capacity(len.min(MAX_PREALLOCATED));
                let mut pos = next;
                for _ in 0..len {
                    let Some((item, after)) = parse_at(buf, pos, depth + 1)? else {
                        return Ok(None);
                    };
                    items.push(item);
                    pos = after;
                }
                return Ok(Some((Value::Array(items), pos)));
            }
        },
        other => return Err(unknown_type(other)),
    };
    Ok(Some((value, next)))
}

fn unknown_type(kind: u8) -> ProtocolError {
    malformed(format!("a reply of type {:?} (RESP2 expected)", kind as char))
}

/// The end of a bulk string of `len` bytes starting at `at`: `None` while incomplete, an error when its CRLF is
/// missing.
fn bulk_end(buf: &[u8], at: usize, len: usize) -> Result<Option<usize>, ProtocolError> {
    let end = at + len;
    // Byte by byte: a slice or array comparison compiles to a `memcmp` call, measurable per field.
    match (buf.get(end), buf.get(end + 1)) {
        (Some(&b'\r'), Some(&b'\n')) => Ok(Some(end + 2)),
        (Some(_), Some(_)) => Err(malformed("a bulk string not ended by CRLF")),
        _ => Ok(None),
    }
}

/// How many bytes the first reply in `buf` takes, without building it: `Ok(None)` when `buf` does not hold all
/// of it yet. The grammar and the bounds of [`parse`]; error lines are not read (a [`Cursor`] user hands an
/// error frame to [`parse`]).
///
/// # Errors
/// As [`parse`].
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
    FrameScanner::default().scan(buf)
}

/// Measures one reply as its bytes arrive, resuming where the last call stopped: a reply that comes in many
/// reads (large entries) is scanned once in all, not once per read (which is quadratic in the reply's size).
///
/// Give it the same buffer each time, only ever longer (bytes appended); start a new one for the next reply.
#[derive(Debug, Clone, Default)]
pub struct FrameScanner {
    /// Where the next value starts.
    pos: usize,
    /// Elements still to come of every array entered and not finished, innermost last.
    open: Vec<usize>,
}

impl FrameScanner {
    /// The reply's length once `buf` holds all of it; `Ok(None)` until then.
    ///
    /// # Errors
    /// As [`parse`].
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
        loop {
            let Some(&kind) = buf.get(self.pos) else {
                return Ok(None);
            };
            let Some((end, next)) = line(buf, self.pos + 1)? else {
                return Ok(None);
            };
            let body = &buf[self.pos + 1..end];
            let after = match kind {
                b'+' => {
                    std::str::from_utf8(body).map_err(|_| malformed("a status that is not UTF-8"))?;
                    next
                }
                b'-' => next,
                b':' => {
                    integer(body)?;
                    next
                }
                b'$' => match length(body, MAX_BULK_LEN)? {
                    None => next,
                    Some(len) => match bulk_end(buf, next, len)? {
                        Some(after) => after,
                        None => return Ok(None),
                    },
                },
                b'*' => match length(body, MAX_ARRAY_LEN)? {
                    None | Some(0) => next,
                    Some(len) => {
                        if self.open.len() >= MAX_DEPTH {
                            return Err(malformed("arrays nested too deep"));
                        }
                        self.open.push(len);
                        self.pos = next;
                        continue;
                    }
                },
                other => return Err(unknown_type(other)),
            };
            self.pos = after;
            // A value is complete: it counts for the array around it, which may be complete in turn.
            loop {
                match self.open.last_mut() {
                    None => return Ok(Some(self.pos)),
                    Some(left) => {
                        *left -= 1;
                        if *left > 0 {
                            break;
                        }
                        self.open.pop();
                    }
                }
            }
        }
    }
}

/// Reads the values of one complete reply (a frame [`frame_len`] measured) in order, without building them: for
/// a caller that decodes a reply of known shape straight into its own types (the consumer's entry batches),
/// skipping the [`Value`] tree and its allocation per element.
///
/// Every method checks what it finds: a reply of another shape is an error, never a panic.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `frame`.
    pub fn new(frame: &'a [u8]) -> Self {
        Cursor { buf: frame, pos: 0 }
    }

    /// The type byte of the next value (`*`, `$`, `+`, `-`, `:`), `None` at the end.
    pub fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    /// Whether every byte was read.
    pub fn is_done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// The next value's type byte and header line, moving past the line.
    fn header(&mut self) -> Result<(u8, &'a [u8]), ProtocolError> {
        let kind = self.peek().ok_or_else(truncated)?;
        let (end, next) = line(self.buf, self.pos + 1)?.ok_or_else(truncated)?;
        let body = &self.buf[self.pos + 1..end];
        self.pos = next;
        Ok((kind, body))
    }

    /// An array's length; `None` for a nil (array or bulk string).
    ///
    /// # Errors
    /// The next value is of another type, or malformed.
    pub fn array(&mut self) -> Result<Option<usize>, ProtocolError> {
        match self.header()? {
            (b'*', body) => length(body, MAX_ARRAY_LEN),
            (b'$', body) if length(body, MAX_BULK_LEN)?.is_none() => Ok(None),
            (kind, _) => Err(malformed(format!("{:?} where an array was expected", kind as char))),
        }
    }

    /// A bulk string's bytes (or a status line's); `None` for a nil (bulk string or array).
    ///
    /// # Errors
    /// The next value is of another type, or malformed.
    pub fn bulk(&mut self) -> Result<Option<&'a [u8]>, ProtocolError> {
        match self.header()? {
            (b'$', body) => match length(body, MAX_BULK_LEN)? {
                None => Ok(None),
                Some(len) => {
                    let at = self.pos;
                    self.pos = bulk_end(self.buf, at, len)?.ok_or_else(truncated)?;
                    Ok(Some(&self.buf[at..at + len]))
                }
            },
            (b'+', body) => Ok(Some(body)),
            (b'*', body) if length(body, MAX_ARRAY_LEN)?.is_none() => Ok(None),
            (kind, _) => Err(malformed(format!("{:?} where a string was expected", kind as char))),
        }
    }

    /// Moves past the next value, whatever it is.
    ///
    /// # Errors
    /// The next value is malformed or incomplete.
    pub fn skip(&mut self) -> Result<(), ProtocolError> {
        let len = frame_len(&self.buf[self.pos..])?.ok_or_else(truncated)?;
        self.pos += len;
        Ok(())
    }
}

fn truncated() -> ProtocolError {
    malformed("a reply cut short")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(bytes: &[u8]) -> Value {
        let (v, used) = parse(bytes).unwrap().expect("complete");
        assert_eq!(used, bytes.len());
        v
    }

    #[test]
    fn commands_are_written_as_redis_rs_packs_them() {
        let mut buf = Vec::new();
        write_command(&mut buf, 5);
        for arg in [&b"XADD"[..], b"s", b"*", b"f", b""] {
            write_arg(&mut buf, arg);
        }
        let packed = redis::cmd("XADD")
            .arg("s")
            .arg("*")
            .arg("f")
            .arg("")
            .get_packed_command();
        assert_eq!(buf, packed);
        let mut n = Vec::new();
        write_int_arg(&mut n, 1234567890);
        assert_eq!(n, b"$10\r\n1234567890\r\n");
        for x in [0, 7, 10, 99, u64::MAX] {
            assert_eq!(Decimal::new(x).as_bytes(), x.to_string().as_bytes());
        }
        for len in [0, 9, 10, 99, 100, 123_456] {
            let mut b = Vec::new();
            write_arg(&mut b, &vec![b'x'; len]);
            assert_eq!(b.len(), arg_len(len));
        }
    }

    #[test]
    fn replies_read_like_redis_rs_reads_them() {
        for bytes in SAMPLES {
            assert_eq!(one(bytes), redis::parse_redis_value(bytes).unwrap(), "{bytes:?}");
        }
    }

    #[test]
    fn an_error_reply_keeps_its_kind() {
        let Value::ServerError(e) = one(b"-NOSCRIPT No matching script\r\n") else {
            panic!("not an error");
        };
        let e: redis::RedisError = e.into();
        assert_eq!(e.kind(), redis::ErrorKind::Server(redis::ServerErrorKind::NoScript));
    }

    #[test]
    fn every_prefix_of_a_reply_is_incomplete() {
        let bytes = b"*3\r\n$15\r\n1700000000000-0\r\n+QUEUED\r\n*1\r\n:5\r\n";
        for cut in 0..bytes.len() {
            assert_eq!(parse(&bytes[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert!(parse(bytes).unwrap().is_some());
    }

    /// Replies of every kind Redis sends the SDK, some nested.
    const SAMPLES: &[&[u8]] = &[
        b"+OK\r\n",
        b"+QUEUED\r\n",
        b":-42\r\n",
        b":0\r\n",
        b"$-1\r\n",
        b"$0\r\n\r\n",
        b"$15\r\n1700000000000-0\r\n",
        b"*-1\r\n",
        b"*0\r\n",
        b"*3\r\n$2\r\nab\r\n:7\r\n-ERR nope\r\n",
        b"*2\r\n*1\r\n+x\r\n$-1\r\n",
        b"-NOSCRIPT No matching script\r\n",
        b"-EXECABORT Transaction discarded\r\n",
        b"-MOVED 3999 127.0.0.1:6381\r\n",
        b"*1\r\n*2\r\n$1\r\nk\r\n*2\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n*2\r\n$3\r\n1-1\r\n*-1\r\n",
    ];

    #[test]
    fn a_frame_is_as_long_as_the_parser_reads() {
        for bytes in SAMPLES {
            let (_, used) = parse(bytes).unwrap().unwrap();
            assert_eq!(frame_len(bytes).unwrap(), Some(used), "{bytes:?}");
            for cut in 0..bytes.len() {
                assert_eq!(frame_len(&bytes[..cut]).unwrap(), None, "{bytes:?} cut at {cut}");
            }
            let two = [*bytes, b":1\r\n"].concat();
            assert_eq!(frame_len(&two).unwrap(), Some(used));
        }
    }

    #[test]
    fn a_scanner_fed_piece_by_piece_measures_what_frame_len_measures() {
        for bytes in SAMPLES {
            let whole = frame_len(bytes).unwrap();
            for step in [1, 2, 3, 7] {
                let mut scanner = FrameScanner::default();
                let mut got = None;
                let mut have = 0;
                while got.is_none() && have < bytes.len() {
                    have = (have + step).min(bytes.len());
                    got = scanner.scan(&bytes[..have]).unwrap();
                }
                assert_eq!(got, whole, "{bytes:?} in pieces of {step}");
            }
        }
        // A large bulk string arriving in pieces: the scanner waits at its header, not rescanning what it passed.
        let big = [&b"*2\r\n:1\r\n$100000\r\n"[..], &vec![b'x'; 100_000], b"\r\n"].concat();
        let mut scanner = FrameScanner::default();
        for have in (0..big.len()).step_by(4096) {
            assert_eq!(scanner.scan(&big[..have]).unwrap(), None);
        }
        assert_eq!(scanner.scan(&big).unwrap(), Some(big.len()));
    }

    #[test]
    fn a_cursor_reads_a_reply_of_known_shape_and_refuses_another() {
        let mut c = Cursor::new(b"*3\r\n$3\r\nabc\r\n*-1\r\n+st\r\n");
        assert_eq!(c.peek(), Some(b'*'));
        assert_eq!(c.array().unwrap(), Some(3));
        assert_eq!(c.bulk().unwrap(), Some(&b"abc"[..]));
        assert_eq!(c.bulk().unwrap(), None, "a nil array reads as a nil string");
        assert_eq!(c.bulk().unwrap(), Some(&b"st"[..]));
        assert!(c.is_done());
        assert!(c.bulk().is_err(), "nothing left");
        assert!(Cursor::new(b":1\r\n").array().is_err());
        assert!(Cursor::new(b"*1\r\n").bulk().is_err());
        assert!(Cursor::new(b"$5\r\nab\r\n").bulk().is_err(), "cut short");
        assert_eq!(Cursor::new(b"$-1\r\n").array().unwrap(), None);
        let mut c = Cursor::new(b"*2\r\n*1\r\n:1\r\n$1\r\nx\r\n");
        c.skip().unwrap();
        assert!(c.is_done());
    }

    /// Reads a frame with a cursor as deep as it goes; only errors may come out, never a panic.
    fn walk(c: &mut Cursor<'_>, depth: usize) -> Result<(), ProtocolError> {
        match c.peek() {
            Some(b'*') if depth < 4 => {
                if let Some(n) = c.array()? {
                    for _ in 0..n.min(64) {
                        walk(c, depth + 1)?;
                    }
                }
                Ok(())
            }
            Some(b'$' | b'+') => c.bulk().map(|_| ()),
            _ => c.skip(),
        }
    }

    #[test]
    fn a_cursor_on_damaged_bytes_fails_without_panicking() {
        for bytes in SAMPLES {
            for cut in 0..bytes.len() {
                let _ = walk(&mut Cursor::new(&bytes[..cut]), 0);
            }
            for at in 0..bytes.len() {
                for b in [b'*', b'$', b'-', b'\r', b'9', b'0', 0xff] {
                    let mut damaged = bytes.to_vec();
                    damaged[at] = b;
                    let _ = walk(&mut Cursor::new(&damaged), 0);
                    let _ = frame_len(&damaged);
                }
            }
        }
    }

    #[test]
    fn two_replies_in_a_row_are_read_one_at_a_time() {
        let bytes = b"$1\r\na\r\n:2\r\n";
        let (first, used) = parse(bytes).unwrap().unwrap();
        assert_eq!(first, Value::BulkString(b"a".to_vec()));
        assert_eq!(parse(&bytes[used..]).unwrap().unwrap(), (Value::Int(2), 4));
    }

    #[test]
    fn malformed_or_oversized_replies_are_refused_before_allocating() {
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        for bytes in [
            &b"?1\r\n"[..],
            b"$abc\r\n",
            b"$-2\r\n",
            b"$536870913\r\n",
            b"*268435457\r\n",
            b"$3\r\nabcXY",
            b":99999999999999999999\r\n",
            b":\r\n",
            b"+a\rb\r\n",
            b"+\xff\r\n",
            b"%1\r\n",
            deep.as_bytes(),
        ] {
            assert!(parse(bytes).is_err(), "{bytes:?}");
            assert!(frame_len(bytes).is_err(), "frame_len: {bytes:?}");
        }
        let long = vec![b'a'; MAX_LINE_LEN + 2];
        assert!(parse(&[b"+", &long[..]].concat()).is_err());
        // A huge announced array that is not there yet waits for its elements with a bounded reservation.
        assert_eq!(parse(b"*268435456\r\n:1\r\n").unwrap(), None);
    }
}
