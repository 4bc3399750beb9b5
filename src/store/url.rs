//! Redis URLs: parsed by cronlock itself into the node and the session they ask for (TLS,
//! credentials, database), with the password kept out of every message; `dial.rs` connects.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};

use crate::clock::Instant;
use crate::store::tls::TlsOptions;
use crate::store::wire::{Addr, Session, Wire, WireError};

/// One Redis server: where it is and how to open a session on it.
#[derive(Clone)]
pub struct Node {
    pub addr: Addr,
    pub session: Session,
}

impl Node {
    /// Parse a one-server URL, which came from `source` (a flag or variable, for messages), and
    /// read the TLS files for a `rediss://` URL. The URL is cronlock's own business (no feature of
    /// a client library decides which schemes a build understands), and a URL that does not
    /// parse is never echoed: the message names the source and the scheme at most.
    pub fn parse(url: &str, source: &str, tls: &TlsOptions) -> Result<Node> {
        let invalid = |problem: &str| anyhow!("invalid {source}{}: {problem}", scheme_shown(url));
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(invalid(EXPECTED));
        };
        let Parts {
            addr,
            tls: is_tls,
            user,
            password,
            db,
        } = match scheme.to_ascii_lowercase().as_str() {
            "redis" | "rediss" => tcp_parts(url, &invalid)?,
            "redis+unix" | "unix" => unix_parts(rest, &invalid)?,
            "rediss+unix" => {
                return Err(invalid(
                    "TLS over a Unix socket is not a thing; use redis+unix:// (the socket is \
                     local) or rediss://host:port",
                ))
            }
            _ => return Err(invalid(EXPECTED)),
        };
        if !is_tls && tls.any() {
            let shown_url = redact_url(url);
            bail!(
                "--tls-ca-cert, --tls-cert and --tls-key are for rediss:// URLs, and \
                 {source} is '{shown_url}'"
            );
        }
        let session = Session {
            tls: if is_tls {
                Some(tls.client_config()?)
            } else {
                None
            },
            user,
            password,
            db,
        };
        Ok(Node { addr, session })
    }

    /// Connect and open the session within `timeout`, TLS handshake and `AUTH` included.
    pub fn connect(&self, timeout: Duration) -> Result<Wire, WireError> {
        Wire::connect(&self.addr, &self.session, Instant::now() + timeout)
    }
}

/// A URL that names several hosts (Sentinel, Cluster):
/// `SCHEME://[user][:password@]host[:port][,host[:port]...][/path][?name=value&...]`.
#[derive(Debug, Default)]
pub struct HostsUrl {
    /// The scheme starts with `rediss`.
    pub tls: bool,
    pub user: Option<String>,
    pub password: Option<String>,
    pub hosts: Vec<Addr>,
    /// The path's segments, decoded (empty ones dropped).
    pub path: Vec<String>,
    /// The query's pairs, decoded.
    pub query: Vec<(String, String)>,
}

impl HostsUrl {
    /// Parse `url`; a host without a port gets `default_port` (None: the port is required).
    /// The error says what is wrong, without the URL (the caller names it, redacted).
    pub fn parse(url: &str, default_port: Option<u16>) -> Result<HostsUrl, String> {
        let (scheme, rest) = url.split_once("://").ok_or("no scheme")?;
        let (rest, query) = match rest.rfind('?') {
            Some(q) if !rest[q..].contains('@') => (&rest[..q], Some(&rest[q + 1..])),
            _ => (rest, None),
        };
        // The userinfo runs to the last '@', as in `redact_url`: passwords may hold '/' and '@'.
        let (userinfo, rest) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let mut out = HostsUrl {
            tls: scheme.starts_with("rediss"),
            ..HostsUrl::default()
        };
        if let Some(info) = userinfo {
            let (user, password) = match info.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (info, None),
            };
            out.user = Some(decode(user)?).filter(|u| !u.is_empty());
            out.password = password.map(decode).transpose()?;
        }
        for host in authority.split(',') {
            out.hosts.push(host_port(host, default_port)?);
        }
        out.path = path
            .split('/')
            .filter(|p| !p.is_empty())
            .map(decode)
            .collect::<Result<_, _>>()?;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            out.query.push((decode(k)?, decode(v)?));
        }
        Ok(out)
    }
}

/// `host[:port]` or `[v6]:port`.
fn host_port(text: &str, default_port: Option<u16>) -> Result<Addr, String> {
    let (host, port) = match text.strip_prefix('[') {
        Some(v6) => {
            let (host, rest) = v6.split_once(']').ok_or("an IPv6 address without ']'")?;
            (host, rest.strip_prefix(':'))
        }
        None => match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        },
    };
    if host.is_empty() {
        return Err("an empty host name (hosts are separated by single commas)".into());
    }
    let port = match (port, default_port) {
        (Some(p), _) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("port '{p}' of host '{host}' is not a port number"))?,
        (None, Some(d)) => d,
        (None, None) => return Err(format!("host '{host}' needs a port (host:port)")),
    };
    Ok(Addr::Tcp {
        host: host.to_string(),
        port,
    })
}

/// Undo percent-encoding (`%40` is `@`).
fn decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a '%' that is not followed by two hex digits")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent-encoding that is not UTF-8".into())
}

/// The URLs cronlock understands, for a URL that is none of them.
const EXPECTED: &str = "expected redis://[user][:password@]host[:port][/db], rediss://... (TLS), \
     redis+unix:///path/to/socket, redis+sentinel://host[:port][,host...]/SERVICE or \
     redis+cluster://host:port[,host:port...]";

/// ` (a 'SCHEME://' URL)` for a message about a URL that did not parse: the scheme is shown
/// when it looks like one (lowercase letters, `+`, `-`), the rest of the text never.
pub fn scheme_shown(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, _))
            if !scheme.is_empty()
                && scheme.len() <= 16
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || "+-".contains(c)) =>
        {
            format!(" (a '{scheme}://' URL)")
        }
        _ => String::new(),
    }
}

/// A database number: a non-negative integer.
fn database(text: &str) -> Result<i64, String> {
    text.parse::<i64>()
        .ok()
        .filter(|d| *d >= 0)
        .ok_or_else(|| "the database is not a number (expected /0, /1, ...)".to_string())
}

/// An unknown query parameter, named only when it looks like a parameter's name (a value
/// typed where a name goes could be a secret).
fn unknown_parameter(key: &str, known: &str) -> String {
    if !key.is_empty()
        && key.len() <= 32
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        format!("unknown parameter '{key}' (known: {known})")
    } else {
        format!("a parameter cronlock does not know (known: {known})")
    }
}

/// A failed exchange as one readable line: `WRONGPASS invalid username-password pair`, with a
/// hint where one helps, without the script location Redis appends, and never echoing a
/// command's arguments (they hold the lock value).
pub fn explain(e: &WireError) -> String {
    let text = match e {
        WireError::Server(text) => text,
        WireError::Io(io) if io.to_lowercase().contains("reset by peer") => {
            // A TLS-only port drops a client that speaks plain RESP.
            return "the server closed the connection (a TLS port? use rediss:// for it)".into();
        }
        _ => return e.to_string(),
    };
    // A command too long for a client that has not authenticated is refused before NOAUTH.
    let unauthenticated = text.contains("Protocol error: unauthenticated");
    match e.code() {
        _ if unauthenticated => {
            return "the server wants a password: give it in the URL \
                    (redis://[user]:PASSWORD@host:port), best through CRONLOCK_REDIS_URL_FILE"
                .into()
        }
        Some("NOAUTH") => {
            return "the server wants a password: give it in the URL \
                    (redis://[user]:PASSWORD@host:port), best through CRONLOCK_REDIS_URL_FILE"
                .into()
        }
        Some("MOVED" | "ASK") => {
            return "the server is a Redis Cluster node that does not serve this KEY's slot: \
                    use redis+cluster://HOST:PORT[,HOST:PORT...] for a cluster"
                .into()
        }
        Some("NOPERM") => {
            let detail = text.split_once(' ').map_or("", |(_, d)| d);
            return format!(
                "NOPERM the Redis user may not run this (see the README for the ACL cronlock needs): {}",
                detail.split(',').next().unwrap_or_default()
            );
        }
        _ => {}
    }
    let text = text.lines().next().unwrap_or_default();
    let text = text.split(" script: ").next().unwrap_or(text);
    // "unknown command 'EVALSHA', with args beginning with: 'sha' '1' 'cronlock:{k}' '{...}'"
    let text = text
        .split(", with args beginning with")
        .next()
        .unwrap_or(text);
    let mut text = text.trim().to_string();
    if text.contains("unknown command") {
        text += " (not a Redis server that runs scripts: a Sentinel? use \
                 redis+sentinel://)";
    }
    text
}

/// Replace the password of a Redis URL (and `pass=`, `password=`, `sentinel_password=` query
/// values) with `***`. Works on text that does not parse: the userinfo runs to the *last* `@`,
/// since generated passwords contain `/`, `?`, `#` and `@`.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let (authority, tail) = match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let shown = match userinfo.find(':') {
                // A user name never holds '/', so a '/' before the colon means no user name.
                Some(colon) if !userinfo[..colon].contains(['/', '?', '#']) => {
                    format!("{}:***", &userinfo[..colon])
                }
                _ => "***".to_string(),
            };
            (shown + "@", &rest[at + 1..])
        }
        None => (String::new(), rest),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if secret_param(k) => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}{authority}{tail}")
}

/// A query parameter that may hold a secret: its name, decoded (`pa%73s` is `pass`) and in any
/// case (`PASS`), says password, secret, token or auth, or cannot be decoded at all.
fn secret_param(key: &str) -> bool {
    let Ok(key) = decode(key) else {
        return true;
    };
    let key = key.to_ascii_lowercase();
    ["pass", "secret", "token", "auth"]
        .iter()
        .any(|s| key.contains(s))
}

/// What a URL names: the address, TLS or not, the user, the password and the database.
/// What a URL says: where the server is, whether to speak TLS, and the session's credentials and
/// database.
struct Parts {
    addr: Addr,
    tls: bool,
    user: Option<String>,
    password: Option<String>,
    db: i64,
}

/// A `redis://` or `rediss://` URL's parts.
fn tcp_parts(url: &str, invalid: &dyn Fn(&str) -> anyhow::Error) -> Result<Parts> {
    let u = HostsUrl::parse(url, Some(6379)).map_err(|p| invalid(&p))?;
    let [addr] = u.hosts.as_slice() else {
        return Err(invalid(
            "several hosts in a redis:// URL (for a Sentinel or a Cluster use \
                 redis+sentinel:// or redis+cluster://; for several masters give several URLs)",
        ));
    };
    if let Some((k, _)) = u.query.first() {
        return Err(invalid(&unknown_parameter(k, "none for redis:// URLs")));
    }
    let db = match u.path.as_slice() {
        [] => 0,
        [db] => database(db).map_err(|p| invalid(&p))?,
        _ => {
            return Err(invalid(
                "expected redis://[user][:password@]host[:port][/db]",
            ))
        }
    };
    Ok(Parts {
        addr: addr.clone(),
        tls: u.tls,
        user: u.user,
        password: u.password,
        db,
    })
}

/// A `redis+unix://` (or `unix://`) URL's parts, from what follows `://`.
fn unix_parts(rest: &str, invalid: &dyn Fn(&str) -> anyhow::Error) -> Result<Parts> {
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.contains('@') {
        return Err(invalid(
            "credentials go in the query of a socket URL: \
                 redis+unix:///path/to/socket?user=NAME&pass=PASSWORD",
        ));
    }
    let path = decode(path).map_err(|p| invalid(&p))?;
    if !path.starts_with('/') {
        return Err(invalid(
            "expected redis+unix:///path/to/socket (an absolute path, three slashes)",
        ));
    }
    let (mut user, mut password, mut db) = (None, None, 0);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (decode(k), decode(v));
        let k = k.map_err(|p| invalid(&p))?.to_ascii_lowercase();
        let v = v.map_err(|p| invalid(&p))?;
        match k.as_str() {
            "db" => db = database(&v).map_err(|p| invalid(&p))?,
            "user" | "username" => user = Some(v).filter(|u| !u.is_empty()),
            "pass" | "password" => password = Some(v),
            _ => return Err(invalid(&unknown_parameter(&k, "db, user, pass"))),
        }
    }
    Ok(Parts {
        addr: Addr::Unix(path.into()),
        tls: false,
        user,
        password,
        db,
    })
}

#[cfg(test)]
mod tests {
    use super::{redact_url, Node};
    use crate::store::tls::TlsOptions;
    use crate::store::wire::Addr;

    fn node(url: &str) -> Result<Node, String> {
        Node::parse(url, "--redis-url", &TlsOptions::default()).map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn parses_the_urls_of_one_server() {
        let n = node("redis://u:p%40ss@h.example:6380/3").unwrap();
        assert_eq!(
            n.addr,
            Addr::Tcp {
                host: "h.example".into(),
                port: 6380
            }
        );
        assert_eq!(n.session.user.as_deref(), Some("u"));
        assert_eq!(n.session.password.as_deref(), Some("p@ss"));
        assert_eq!(n.session.db, 3);
        assert!(n.session.tls.is_none());
        let n = node("redis://:a/b@c@[::1]").unwrap();
        assert_eq!(
            n.addr,
            Addr::Tcp {
                host: "::1".into(),
                port: 6379
            }
        );
        assert_eq!(n.session.password.as_deref(), Some("a/b@c"));
        // TLS needs no feature of any library: the configuration comes from rustls.
        assert!(node("rediss://127.0.0.1:6380")
            .unwrap()
            .session
            .tls
            .is_some());
        let n = node("redis+unix:///run/r%20s.sock?db=2&pa%73s=S3cr3t&USER=me").unwrap();
        assert_eq!(n.addr, Addr::Unix("/run/r s.sock".into()));
        assert_eq!(n.session.password.as_deref(), Some("S3cr3t"));
        assert_eq!(n.session.user.as_deref(), Some("me"));
        assert_eq!(n.session.db, 2);
        assert!(node("unix:///run/redis.sock").is_ok());
    }

    #[test]
    fn a_url_that_does_not_parse_is_never_echoed() {
        for (url, says) in [
            ("S3cr3t", "expected redis://"),
            ("http://S3cr3t@h", "(a 'http://' URL): expected redis://"),
            ("redis://:S3cr3t@", "empty host"),
            ("redis://:S3cr3t@h:99999", "not a port"),
            ("redis://:S3cr3t@h/x", "database"),
            ("redis://:S3cr3t@h?pass=S3cr3t", "unknown parameter 'pass'"),
            ("redis+unix://S3cr3t", "absolute path"),
            ("redis+unix:///s?S3cr3t=1", "known: db, user, pass"),
            ("redis+unix:///s?x=%zzS3cr3t", "two hex digits"),
            ("rediss+unix:///s?pass=S3cr3t", "not a thing"),
            ("S3cr3t://h", "expected redis://"),
        ] {
            let e = node(url).err().unwrap_or_else(|| panic!("{url} parsed"));
            assert!(e.starts_with("invalid --redis-url"), "{url}: {e}");
            assert!(e.contains(says), "{url}: {e}");
            assert!(!e.contains("S3cr3t"), "{url}: {e}");
        }
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("redis://:s3cret@h:6379/2"),
            "redis://:***@h:6379/2"
        );
        assert_eq!(redact_url("redis://u:s3cret@h"), "redis://u:***@h");
        assert_eq!(redact_url("redis://s3cret@h"), "redis://***@h");
        assert_eq!(redact_url("redis://h:6379"), "redis://h:6379");
        assert_eq!(
            redact_url("redis+unix:///run/redis.sock?db=1&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(redact_url("nonsense"), "nonsense");
        // Passwords with URL delimiters, and text that does not parse.
        assert_eq!(redact_url("redis://:pa/ss@host"), "redis://:***@host");
        assert_eq!(
            redact_url("redis://:p?a#s@s@host:1/2"),
            "redis://:***@host:1/2"
        );
        assert_eq!(redact_url("redis://u:a@b/c@h"), "redis://u:***@h");
        assert_eq!(redact_url("redis:/:pw@host"), "redis:***@host");
        assert_eq!(
            redact_url("redis://h/0?password=x&db=1"),
            "redis://h/0?password=***&db=1"
        );
        // Encoded and capitalised names, and a password with a space.
        assert_eq!(
            redact_url("redis+unix:///run/redis.sock?pa%73s=S3cr3t&db=99"),
            "redis+unix:///run/redis.sock?pa%73s=***&db=99"
        );
        assert_eq!(
            redact_url("redis+unix:///s?PASS=S3cr3t"),
            "redis+unix:///s?PASS=***"
        );
        assert_eq!(
            redact_url("redis://:hunter2 secret@host:6379"),
            "redis://:***@host:6379"
        );
    }
}
