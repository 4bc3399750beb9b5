//! Connecting to Redis: URL parsing, the session a URL asks for (TLS, credentials, database), and
//! keeping the password out of every message.

use std::time::Duration;

use anyhow::{bail, Result};
use redis::{ConnectionAddr, IntoConnectionInfo};

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
    /// read the TLS files for a `rediss://` URL. Errors name the redacted URL, never the password.
    pub fn parse(url: &str, source: &str, tls: &TlsOptions) -> Result<Node> {
        let shown_url = redact_url(url);
        if url.starts_with("rediss+unix:") {
            bail!(
                "invalid {source} '{shown_url}': TLS over a Unix socket is not a thing; use \
                 redis+unix:// (the socket is local) or rediss://host:port"
            );
        }
        let invalid = |e: redis::RedisError| {
            anyhow::anyhow!("invalid {source} '{shown_url}': {}", url_problem(&e))
        };
        let info = url.into_connection_info().map_err(invalid)?;
        let (addr, is_tls) = match info.addr() {
            ConnectionAddr::Tcp(h, p) => (Addr::Tcp(h.clone(), *p), false),
            ConnectionAddr::TcpTls { host, port, .. } => (Addr::Tcp(host.clone(), *port), true),
            ConnectionAddr::Unix(path) => (Addr::Unix(path.clone()), false),
            _ => bail!("invalid {source} '{shown_url}': an address cronlock cannot use"),
        };
        if !is_tls && tls.any() {
            bail!(
                "--tls-ca-cert, --tls-cert and --tls-key are for rediss:// URLs, and \
                 {source} is '{shown_url}'"
            );
        }
        let settings = info.redis_settings();
        let session = Session {
            tls: if is_tls {
                Some(tls.client_config()?)
            } else {
                None
            },
            user: settings.username().map(str::to_string),
            password: settings.password().map(str::to_string),
            db: settings.db(),
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
    pub hosts: Vec<(String, u16)>,
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
fn host_port(text: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
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
    Ok((host.to_string(), port))
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

/// What is wrong with a URL, in words a user can act on.
fn url_problem(e: &redis::RedisError) -> String {
    let text = e.to_string();
    let text = text.trim_end_matches(" - InvalidClientConfig");
    if text.contains("did not parse") {
        "expected redis://[user][:password@]host[:port][/db], rediss://... (TLS), \
         redis+unix:///path/to/socket, redis+sentinel://host[:port][,host...]/SERVICE or \
         redis+cluster://host:port[,host:port...]"
            .into()
    } else {
        text.to_lowercase()
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
        text += " (not a Redis server that runs scripts: a Sentinel? use redis+sentinel://)";
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
                    Some((k, _)) if SECRET_PARAMS.contains(&k) => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}{authority}{tail}")
}

/// Query parameters that hold a password.
const SECRET_PARAMS: &[&str] = &["pass", "password", "sentinel_password"];

#[cfg(test)]
mod tests {
    use super::redact_url;

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
    }
}
