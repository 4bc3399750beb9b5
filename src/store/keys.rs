//! The Redis keys of one KEY, and reading a KEY back from its lock key.
//!
//! The layout for KEY under the default prefix `cronlock:`. All of a KEY's keys share the hash tag
//! `{KEY}`, so on a Redis Cluster they live in one slot and every script runs on one node. A KEY
//! with `{` or `}` would cut the tag short (or leave it empty): its tag is `{ENCODED}~`, with `%`,
//! `{` and `}` percent-encoded and a `~` after the tag that no brace-free KEY's keys can have, so
//! the KEY can be read back exactly. Brace-free KEYs keep the plain layout:
//! - `cronlock:{KEY}`        the lock; its value identifies the holder
//! - `cronlock:{KEY}:fence`  the fencing counter: the last token, max(last + 1, Redis TIME in µs)
//! - `cronlock:{KEY}:last`   the last run's record (JSON)
//! - `cronlock:{KEY}:history` the last runs' records, newest first, capped
//! - `cronlock:{KEY}:notify` a one-element list that wakes one `--wait`er on release
//! - `cronlock:{KEY}:schedule` with `--schedule`: the last started run's instant and schedule
//! - `cronlock:{KEY}:abandoned:TOKEN` for a TTL after an acquire whose reply was lost
//! - with `--limit N` above 1 (a semaphore): `cronlock:{KEY}:slot:I` for each holder (I in
//!   0..N, held like the plain lock), `cronlock:{KEY}:limit` (N, while holders exist) and
//!   `cronlock:{KEY}:fences` (each slot's fencing token)
//! - `cronlock:{KEY}:ledger` with `--schedule`: the recent instants and their attempts (a hash)
//! - `cronlock:{KEY}:trigger` the manual instants asked for with `--trigger`
//! - `cronlock:{KEY}:replaced` with `--overlap replace`: the runs replaced and maybe still stopping
//! - `cronlock:{KEY}:at:INSTANT` with `--overlap allow`: the lock of one instant's run, and
//!   `cronlock:{KEY}:running` the instants running so
//! - `cronlock:{KEY}:suspend` after `--suspend`: the record while suspended, and the 16 newest
//!   past suspensions (a hash, no expiry: it is the operator's switch)

/// The largest `--limit`: a KEY has at most this many slots.
pub const MAX_LIMIT: u32 = 64;

/// The Redis keys that belong to one KEY.
#[derive(Debug, Clone)]
pub struct Keys {
    pub name: String,
    pub lock: String,
    pub fence: String,
    pub last: String,
    pub history: String,
    pub notify: String,
    pub schedule: String,
    /// With `--limit` above 1: N, kept while holders exist (see `semaphore.lua`).
    pub limit: String,
    /// With `--limit` above 1: each slot's fencing token (a hash).
    pub fences: String,
    /// With `--schedule`: the ledger of recent instants and their attempts (a hash).
    pub ledger: String,
    /// `--suspend`: the suspension record and the past ones (a hash).
    pub suspend: String,
    /// The manual instants asked for with `--trigger` (a hash: instant -> request).
    pub trigger: String,
    /// `--overlap replace`: the runs replaced and maybe still stopping (a hash: holder value ->
    /// when its lock would have lapsed, Redis ms).
    pub replaced: String,
    /// `--overlap allow`: the instants running, each under its own lock (a hash: instant ->
    /// holder value).
    pub running: String,
}

impl Keys {
    pub fn new(prefix: &str, name: &str) -> Keys {
        let lock = format!("{prefix}{}", tag(name));
        Keys {
            name: name.to_string(),
            fence: format!("{lock}:fence"),
            last: format!("{lock}:last"),
            history: format!("{lock}:history"),
            notify: format!("{lock}:notify"),
            schedule: format!("{lock}:schedule"),
            limit: format!("{lock}:limit"),
            fences: format!("{lock}:fences"),
            ledger: format!("{lock}:ledger"),
            suspend: format!("{lock}:suspend"),
            trigger: format!("{lock}:trigger"),
            replaced: format!("{lock}:replaced"),
            running: format!("{lock}:running"),
            lock,
        }
    }

    /// The lock of one instant under `--overlap allow` (`acquire.lua` names it so).
    pub fn at(&self, instant: i64) -> String {
        format!("{}:at:{instant}", self.lock)
    }

    /// These keys with `lock` the key a grant holds: slot `slot` of a `--limit` above 1, or under
    /// `--overlap allow` the instant's own lock (`own_instant`), else KEY's lock.
    pub fn held(mut self, limit: u32, slot: u32, own_instant: Option<i64>) -> Keys {
        if limit > 1 {
            self.lock = self.slot(slot);
        } else if let Some(at) = own_instant {
            self.lock = self.at(at);
        }
        self
    }

    /// Slot `i` of a `--limit` above 1: a lock of its own, held like the plain one.
    pub fn slot(&self, i: u32) -> String {
        format!("{}:slot:{i}", self.lock)
    }

    /// Slots `0..n` (at most [`MAX_LIMIT`] exist).
    pub fn slots(&self, n: u32) -> Vec<String> {
        (0..n).map(|i| self.slot(i)).collect()
    }

    /// The marker that makes a late-running acquire of the attempt `token` take nothing.
    pub fn abandoned(&self, token: &str) -> String {
        format!("{}:abandoned:{token}", self.lock)
    }

    /// The SCAN pattern that finds every lock key under `prefix` (and some others, which
    /// [`Keys::name_of`] tells apart).
    pub fn pattern(prefix: &str) -> String {
        glob_escaped(prefix) + "{*}*"
    }

    /// The KEY of a lock key found by SCAN, if `redis_key` is one (not a `:fence` or other key).
    pub fn name_of(prefix: &str, redis_key: &str) -> Option<String> {
        let inner = redis_key.strip_prefix(prefix)?.strip_prefix('{')?;
        if let Some(name) = inner.strip_suffix('}') {
            return Some(name.to_string()).filter(|n| !n.is_empty() && !n.contains(['{', '}']));
        }
        let encoded = inner.strip_suffix("}~")?;
        if encoded.contains(['{', '}']) {
            return None;
        }
        let name = decode(encoded)?;
        Some(name).filter(|n| n.contains(['{', '}']))
    }
}

/// `text` with SCAN's glob characters escaped, for a pattern that starts with it.
pub fn glob_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The hash tag of KEY: `{KEY}`, or `{ENCODED}~` for a KEY with a brace (see the module comment).
fn tag(name: &str) -> String {
    if !name.contains(['{', '}']) {
        return format!("{{{name}}}");
    }
    let mut out = String::from("{");
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out + "}~"
}

/// Undo [`tag`]'s encoding; None for text it cannot have made.
fn decode(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        out.push(match rest.get(i + 1..i + 3)? {
            "25" => '%',
            "7B" => '{',
            "7D" => '}',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_hash_slot() {
        let k = Keys::new("cronlock:", "nightly");
        assert_eq!(k.lock, "cronlock:{nightly}");
        assert_eq!(k.fence, "cronlock:{nightly}:fence");
        assert_eq!(k.notify, "cronlock:{nightly}:notify");
        assert_eq!(
            Keys::name_of("cronlock:", &k.lock).as_deref(),
            Some("nightly")
        );
        assert_eq!(Keys::name_of("cronlock:", &k.fence), None);
        assert_eq!(Keys::name_of("cronlock:", "other:{x}"), None);
    }

    /// Redis's rule: the tag is between the first `{` and the first `}` after it, if non-empty.
    fn hash_tag(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(len) = key[open + 1..].find('}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }

    #[test]
    fn every_key_keeps_one_tag_and_reads_back() {
        for name in [
            "}",
            "{",
            "{}",
            "a{b}c",
            "a}b",
            "x y",
            "50%",
            "%7D",
            "}~",
            "a}~:fence",
        ] {
            let k = Keys::new("cronlock:", name);
            let tag = hash_tag(&k.lock);
            assert!(!tag.is_empty() && tag != k.lock, "{name}: {}", k.lock);
            for other in [&k.fence, &k.last, &k.history, &k.notify, &k.schedule] {
                assert_eq!(hash_tag(other), tag, "{name}: {other}");
            }
            assert_eq!(hash_tag(&k.abandoned("t")), tag);
            assert_eq!(
                Keys::name_of("cronlock:", &k.lock).as_deref(),
                Some(name),
                "{}",
                k.lock
            );
            for other in [&k.fence, &k.last, &k.notify] {
                assert_eq!(Keys::name_of("cronlock:", other), None, "{other}");
            }
        }
        // Brace-free KEYs keep the layout earlier versions used.
        assert_eq!(Keys::new("cronlock:", "50%").lock, "cronlock:{50%}");
        assert_eq!(Keys::new("cronlock:", "a}b").lock, "cronlock:{a%7Db}~");
    }
}
