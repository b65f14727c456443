//! A tiny synchronous RESP2 client over a `TcpStream`: enough to send
//! commands to the module and read what comes back.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One RESP2 reply.
#[derive(Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+...`
    Simple(String),
    /// `-...`: the whole message, code included (`ERR key: ...`).
    Error(String),
    /// `:...`
    Int(i64),
    /// `$...`, `None` for the null bulk string.
    Bulk(Option<Vec<u8>>),
    /// `*...`, `None` for the null array.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The text of a simple or bulk string, or of an error.
    pub fn text(&self) -> String {
        match self {
            Reply::Simple(s) | Reply::Error(s) => s.clone(),
            Reply::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("expected a string reply, got {other:?}"),
        }
    }

    /// The elements of an array reply.
    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(Some(items)) => items,
            other => panic!("expected an array reply, got {other:?}"),
        }
    }

    /// True for `+OK`.
    pub fn is_ok(&self) -> bool {
        *self == Reply::Simple("OK".into())
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Simple(s) => write!(f, "+{s}"),
            Reply::Error(s) => write!(f, "-{s}"),
            Reply::Int(n) => write!(f, ":{n}"),
            Reply::Bulk(None) => write!(f, "(nil)"),
            Reply::Bulk(Some(b)) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            Reply::Array(None) => write!(f, "(nil array)"),
            Reply::Array(Some(items)) => f.debug_list().entries(items).finish(),
        }
    }
}

/// A connection to one Redis server.
pub struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Connects to `127.0.0.1:port` with a 10-second read timeout.
    pub fn connect(port: u16) -> io::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            reader: BufReader::new(stream),
        })
    }

    /// Sends one command and reads its reply.
    pub fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<Reply> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            let a = a.as_ref();
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&out)?;
        self.read_reply()
    }

    /// Like [`Conn::call`], panicking on an I/O error.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply {
        let name = String::from_utf8_lossy(args[0].as_ref()).into_owned();
        self.call(args)
            .unwrap_or_else(|e| panic!("{name}: no reply from Redis: {e}"))
    }

    /// Reads one more reply (a pub/sub message on a subscribed connection).
    pub fn read(&mut self) -> io::Result<Reply> {
        self.read_reply()
    }

    fn line(&mut self) -> io::Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(line.trim_end_matches("\r\n").to_owned())
    }

    fn read_reply(&mut self) -> io::Result<Reply> {
        let line = self.line()?;
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad RESP line {line:?}"),
            )
        };
        let (kind, rest) = line.split_at_checked(1).ok_or_else(bad)?;
        let number = || rest.parse::<i64>().map_err(|_| bad());
        Ok(match kind {
            "+" => Reply::Simple(rest.to_owned()),
            "-" => Reply::Error(rest.to_owned()),
            ":" => Reply::Int(number()?),
            "$" => match number()? {
                -1 => Reply::Bulk(None),
                n => {
                    let mut buf = vec![0; usize::try_from(n).map_err(|_| bad())? + 2];
                    io::Read::read_exact(&mut self.reader, &mut buf)?;
                    buf.truncate(buf.len() - 2);
                    Reply::Bulk(Some(buf))
                }
            },
            "*" => match number()? {
                -1 => Reply::Array(None),
                n => {
                    let mut items = Vec::new();
                    for _ in 0..n {
                        items.push(self.read_reply()?);
                    }
                    Reply::Array(Some(items))
                }
            },
            _ => return Err(bad()),
        })
    }
}
