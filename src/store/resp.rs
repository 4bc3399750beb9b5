//! The Redis wire format, RESP2 only, read with bounds: no server can make cronlock allocate more
//! than [`MAX_REPLY`] for one reply. cronlock never asks for RESP3 (no `HELLO 3`), so a RESP3
//! type in a reply (`#t`, `_`, `=`, an attribute `|` before a reply, a push `>`) is a broken
//! server, refused like any reply of no Redis type.
//!
//! It exists because a reply is untrusted input. A general client reads whatever length a server
//! declares (`$1000000000`) into memory, and lets one reply nest or count without limit. Lock
//! replies are small, so a reply that declares, nests or grows past the bound is refused as soon as
//! it says so, before its bytes arrive. Parsing is incremental over the bytes read so far: the
//! caller ([`crate::store::wire`]) reads until a whole reply is there, the deadline passes, or the bound
//! is crossed.

use redis::Value;

/// The largest reply cronlock reads: lock replies are tens of bytes; `--status --history 100`
/// with long command lines about 60 KiB; a SCAN batch of 1000 keys about 50 KiB.
pub const MAX_REPLY: usize = 512 * 1024;

/// How deep replies may nest: cronlock's deepest is 3 (CLUSTER SLOTS).
const MAX_DEPTH: usize = 8;

/// A whole reply, as the server sent it.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Value(Value),
    /// `-CODE detail`: the server refused the command.
    Error(String),
}

/// Why bytes are not a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bad {
    /// A reply that is (or declares itself) larger than [`MAX_REPLY`].
    TooLarge,
    /// Not the Redis protocol: what was wrong.
    Protocol(&'static str),
}

/// The command `args` in the wire format (an array of bulk strings).
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// One reply parsed from the start of a buffer.
#[derive(Debug, PartialEq)]
pub struct Parsed {
    pub reply: Reply,
    /// How many bytes of the buffer it took.
    pub used: usize,
}

/// Parse one reply from the start of `buf`: `Ok(None)` when more bytes are needed.
pub fn parse(buf: &[u8]) -> Result<Option<Parsed>, Bad> {
    let mut p = Parser { buf, at: 0 };
    match p.reply(0) {
        Ok(reply) => Ok(Some(Parsed { reply, used: p.at })),
        Err(ParseStop::More) if buf.len() > MAX_REPLY => Err(Bad::TooLarge),
        Err(ParseStop::More) => Ok(None),
        Err(ParseStop::Bad(b)) => Err(b),
    }
}

enum ParseStop {
    More,
    Bad(Bad),
}

impl From<Bad> for ParseStop {
    fn from(b: Bad) -> ParseStop {
        ParseStop::Bad(b)
    }
}

struct Parser<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    /// The next line, without its CRLF.
    fn line(&mut self) -> Result<&[u8], ParseStop> {
        let rest = &self.buf[self.at..];
        let end = rest.windows(2).position(|w| w == b"\r\n");
        match end {
            Some(n) => {
                self.at += n + 2;
                Ok(&rest[..n])
            }
            None if rest.len() > MAX_REPLY => Err(Bad::TooLarge.into()),
            None => Err(ParseStop::More),
        }
    }

    fn text(&mut self) -> Result<String, ParseStop> {
        let line = self.line()?;
        String::from_utf8(line.to_vec())
            .map_err(|_| Bad::Protocol("a line that is not UTF-8").into())
    }

    fn int(&mut self) -> Result<i64, ParseStop> {
        let line = self.line()?;
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(Bad::Protocol("a number that is not a number").into())
    }

    /// A declared length or count: -1 is none; anything past the bound is refused at once.
    fn len(&mut self) -> Result<Option<usize>, ParseStop> {
        match self.int()? {
            -1 => Ok(None),
            n if n < 0 => Err(Bad::Protocol("a negative length").into()),
            n if n as u64 > MAX_REPLY as u64 => Err(Bad::TooLarge.into()),
            n => Ok(Some(n as usize)),
        }
    }

    fn bulk(&mut self, n: usize) -> Result<Vec<u8>, ParseStop> {
        if self.buf.len() < self.at + n + 2 {
            return Err(ParseStop::More);
        }
        let data = self.buf[self.at..self.at + n].to_vec();
        if &self.buf[self.at + n..self.at + n + 2] != b"\r\n" {
            return Err(Bad::Protocol("a bulk string without its CRLF").into());
        }
        self.at += n + 2;
        Ok(data)
    }

    fn items(&mut self, n: usize, depth: usize) -> Result<Vec<Value>, ParseStop> {
        // Never trust a count for an allocation: it grows as elements really arrive.
        let mut v = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            v.push(self.value(depth + 1)?);
        }
        Ok(v)
    }

    fn reply(&mut self, depth: usize) -> Result<Reply, ParseStop> {
        match self.buf.get(self.at) {
            Some(b'-') => {
                self.at += 1;
                Ok(Reply::Error(self.text()?))
            }
            _ => Ok(Reply::Value(self.value(depth)?)),
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, ParseStop> {
        if depth > MAX_DEPTH {
            return Err(Bad::Protocol("a reply nested too deep").into());
        }
        let Some(&kind) = self.buf.get(self.at) else {
            return Err(ParseStop::More);
        };
        self.at += 1;
        Ok(match kind {
            b'+' => match self.text()? {
                s if s == "OK" => Value::Okay,
                s => Value::SimpleString(s),
            },
            b':' => Value::Int(self.int()?),
            b'$' => match self.len()? {
                None => Value::Nil,
                Some(n) => Value::BulkString(self.bulk(n)?),
            },
            b'*' => match self.len()? {
                None => Value::Nil,
                Some(n) => Value::Array(self.items(n, depth)?),
            },
            b'~' | b'>' | b'%' | b'|' | b'_' | b'#' | b',' | b'(' | b'=' | b'!' => {
                return Err(Bad::Protocol("a RESP3 reply in a RESP2 conversation").into())
            }
            b'-' => return Err(Bad::Protocol("an error inside a reply").into()),
            _ => return Err(Bad::Protocol("a reply of no Redis type").into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8]) -> Reply {
        let Parsed { reply: r, used: n } = parse(bytes).unwrap().unwrap();
        assert_eq!(n, bytes.len());
        r
    }

    #[test]
    fn replies() {
        assert_eq!(whole(b"+OK\r\n"), Reply::Value(Value::Okay));
        assert_eq!(whole(b":-42\r\n"), Reply::Value(Value::Int(-42)));
        assert_eq!(whole(b"$-1\r\n"), Reply::Value(Value::Nil));
        assert_eq!(
            whole(b"*2\r\n$3\r\nabc\r\n:1\r\n"),
            Reply::Value(Value::Array(vec![
                Value::BulkString(b"abc".to_vec()),
                Value::Int(1)
            ]))
        );
        assert_eq!(
            whole(b"-NOSCRIPT No matching script\r\n"),
            Reply::Error("NOSCRIPT No matching script".into())
        );
    }

    #[test]
    fn resp3_is_a_broken_server() {
        for bytes in [
            &b"#t\r\n"[..],
            b"_\r\n",
            b"=7\r\ntxt:abc\r\n",
            b"|1\r\n+a\r\n+b\r\n:1\r\n",
            b">2\r\n$10\r\ninvalidate\r\n*0\r\n",
            b"*2\r\n:1\r\n#t\r\n",
            b"%1\r\n:1\r\n:1\r\n",
            b"!3\r\nERR\r\n",
        ] {
            assert!(matches!(parse(bytes), Err(Bad::Protocol(_))), "{bytes:?}");
        }
    }

    #[test]
    fn incomplete_replies_ask_for_more() {
        for partial in [
            &b""[..],
            b"+O",
            b"$5\r\nab",
            b"*2\r\n:1\r\n",
            b"$3\r\nabc\r",
        ] {
            assert_eq!(parse(partial), Ok(None), "{partial:?}");
        }
    }

    #[test]
    fn declared_sizes_past_the_bound_are_refused_at_once() {
        assert_eq!(parse(b"$1000000000\r\n"), Err(Bad::TooLarge));
        assert_eq!(parse(b"*1000000000\r\n"), Err(Bad::TooLarge));
        let long = vec![b'a'; MAX_REPLY + 2];
        let mut line = b"+".to_vec();
        line.extend_from_slice(&long);
        assert_eq!(parse(&line), Err(Bad::TooLarge));
        let deep = "*1\r\n".repeat(20) + ":1\r\n";
        assert!(matches!(parse(deep.as_bytes()), Err(Bad::Protocol(_))));
        assert!(matches!(parse(b"?\r\n"), Err(Bad::Protocol(_))));
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        assert_eq!(encode(&[b"GET", b"k"]), b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }
}
