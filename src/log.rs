//! cronlock's own messages: `cronlock: ...` lines on stderr for people, or one JSON object per line
//! for log pipelines. The child's stdout and stderr never pass through here.
//!
//! Levels decide what prints: errors always, warnings unless `-q`, info only with `-v` in text
//! (cron mails any output, so a normal run is silent) but by default in JSON, where a pipeline
//! wants to see `acquired` and `finished`.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// Fields every JSON line carries once the lock is known.
#[derive(Debug, Default, Clone)]
struct Context {
    key: Option<String>,
    token: Option<String>,
    fence: Option<i64>,
}

/// A cheap, clonable handle shared by the main thread and the watchdog.
#[derive(Debug, Clone)]
pub struct Log {
    min: Level,
    json: bool,
    host: Arc<str>,
    ctx: Arc<Mutex<Context>>,
    /// Strings that must never be printed (the Redis password).
    secrets: Arc<Mutex<Vec<String>>>,
}

impl Log {
    pub fn new(quiet: bool, verbose: bool, json: bool) -> Log {
        let min = match (quiet, verbose, json) {
            (true, _, _) => Level::Error,
            (_, true, true) => Level::Debug,
            (_, true, false) | (_, false, true) => Level::Info,
            (false, false, false) => Level::Warn,
        };
        Log {
            min,
            json,
            host: crate::host::hostname().into(),
            ctx: Arc::default(),
            secrets: Arc::default(),
        }
    }

    pub fn set_key(&self, key: &str) {
        self.ctx.lock().unwrap().key = Some(key.to_string());
    }

    pub fn set_lock(&self, token: &str, fence: i64) {
        let mut ctx = self.ctx.lock().unwrap();
        ctx.token = Some(token.to_string());
        ctx.fence = Some(fence);
    }

    /// Register a string (a password) that is replaced by `***` wherever it would be printed.
    pub fn add_secret(&self, secret: &str) {
        if !secret.is_empty() {
            self.secrets.lock().unwrap().push(secret.to_string());
        }
    }

    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in self.secrets.lock().unwrap().iter() {
            out = out.replace(s.as_str(), "***");
        }
        out
    }

    pub fn enabled(&self, level: Level) -> bool {
        level >= self.min
    }

    /// Emit one event. `msg` is the human sentence; `fields` add machine-readable detail in JSON.
    pub fn event(&self, level: Level, event: &str, msg: &str, fields: &[(&str, Value)]) {
        if !self.enabled(level) {
            return;
        }
        let line = if self.json {
            let ctx = self.ctx.lock().unwrap().clone();
            let mut obj = Map::new();
            obj.insert("ts".into(), Value::from(crate::host::unix_millis()));
            obj.insert("level".into(), level.name().into());
            obj.insert("event".into(), event.into());
            if let Some(k) = ctx.key {
                obj.insert("key".into(), k.into());
            }
            if let Some(t) = ctx.token {
                obj.insert("token".into(), t.into());
            }
            if let Some(f) = ctx.fence {
                obj.insert("fencing_token".into(), f.into());
            }
            obj.insert("host".into(), Value::from(&*self.host));
            obj.insert("pid".into(), std::process::id().into());
            for (k, v) in fields {
                obj.insert((*k).to_string(), v.clone());
            }
            obj.insert("msg".into(), msg.into());
            Value::Object(obj).to_string()
        } else {
            format!("cronlock: {msg}")
        };
        // One write per line, so lines stay whole next to the command's own stderr output.
        let mut line = self.redact(&line);
        line.push('\n');
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    pub fn error(&self, event: &str, msg: &str) {
        self.event(Level::Error, event, msg, &[]);
    }

    pub fn warn(&self, event: &str, msg: &str) {
        self.event(Level::Warn, event, msg, &[]);
    }

    pub fn info(&self, event: &str, msg: &str, fields: &[(&str, Value)]) {
        self.event(Level::Info, event, msg, fields);
    }
}
