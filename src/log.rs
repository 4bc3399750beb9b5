//! cronlock's own messages: `cronlock: ...` lines on stderr for people, or one JSON object per line
//! for log pipelines. The child's stdout and stderr never pass through here.
//!
//! Levels decide what prints: errors always, warnings unless `-q`, info only with `-v` in text
//! (cron mails any output, so a normal run is silent) but by default in JSON, where a pipeline
//! wants to see `acquired` and `finished`.
//!
//! Writing to stderr can block forever: it is often a pipe that cron's or the container runtime's
//! collector stopped reading, or that the command itself filled. So no thread that keeps the lock
//! safe ever writes: lines go into a bounded queue, and a `log` thread (started with the first
//! line, so a silent run starts none) does the writing. A full queue drops lines and counts them;
//! the count is reported once the writer gets through. At exit, [`Log::flush`] waits only briefly.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Lines that may wait for a slow stderr before new ones are dropped.
const QUEUE: usize = 256;

/// The queue and its writer thread.
#[derive(Debug, Default)]
struct Sink {
    tx: Mutex<Option<SyncSender<String>>>,
    done: Mutex<Option<Receiver<()>>>,
    dropped: Arc<AtomicU64>,
    /// Set by `flush`: later lines are written directly.
    closed: AtomicBool,
}

/// An I/O error as message text: "no such file or directory", without "(os error 2)".
pub fn io_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    text.split(" (os error")
        .next()
        .unwrap_or(&text)
        .to_lowercase()
}

fn write_stderr(line: &str) {
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

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

/// How long the exit waits for queued log lines to reach a slow stderr.
pub const FLUSH_WAIT: Duration = Duration::from_millis(500);

/// `--log-format` values.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum LogFormat {
    /// `cronlock: ...` lines
    Text,
    /// one JSON object per line
    Json,
}

/// How much cronlock says: `-q` errors only; by default warnings (and, as JSON, what a run does);
/// `-v` what a run does (and, as JSON, the debug events too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Verbosity {
    Quiet,
    Normal,
    Verbose,
}

/// A cheap, clonable handle shared by the main thread and the watchdog.
#[derive(Debug, Clone)]
pub struct Log {
    min: Level,
    json: bool,
    host: Arc<str>,
    ctx: Arc<Mutex<Context>>,
    sink: Arc<Sink>,
}

impl Log {
    pub fn new(verbosity: Verbosity, format: LogFormat) -> Log {
        let json = format == LogFormat::Json;
        let min = match (verbosity, json) {
            (Verbosity::Quiet, _) => Level::Error,
            (Verbosity::Verbose, true) => Level::Debug,
            (Verbosity::Verbose, false) | (Verbosity::Normal, true) => Level::Info,
            (Verbosity::Normal, false) => Level::Warn,
        };
        Log {
            min,
            json,
            host: crate::host::hostname().into(),
            ctx: Arc::default(),
            sink: Arc::default(),
        }
    }

    /// The line that reports dropped lines.
    fn dropped_line(json: bool, host: &str, n: u64) -> String {
        let msg = format!("{n} of cronlock's messages were dropped: stderr was not being read");
        let mut line = if json {
            serde_json::json!({
                "ts": crate::clock::unix_millis(), "level": "warn", "event": "log_dropped",
                "host": host, "pid": std::process::id(), "dropped": n, "msg": msg,
            })
            .to_string()
        } else {
            format!("cronlock: {msg}")
        };
        line.push('\n');
        line
    }

    /// Queue one finished line; never blocks.
    fn emit(&self, line: String) {
        if self.sink.closed.load(Ordering::SeqCst) {
            return write_stderr(&line);
        }
        let mut tx = self.sink.tx.lock().unwrap_or_else(|e| e.into_inner());
        if tx.is_none() {
            let (send, recv) = mpsc::sync_channel::<String>(QUEUE);
            let (done_tx, done_rx) = mpsc::channel();
            let dropped = self.sink.dropped.clone();
            let (json, host) = (self.json, self.host.clone());
            let spawned = std::thread::Builder::new()
                .name("log".into())
                .stack_size(64 * 1024)
                .spawn(move || {
                    for line in recv {
                        let n = dropped.swap(0, Ordering::SeqCst);
                        if n > 0 {
                            write_stderr(&Log::dropped_line(json, &host, n));
                        }
                        write_stderr(&line);
                    }
                    let n = dropped.swap(0, Ordering::SeqCst);
                    if n > 0 {
                        write_stderr(&Log::dropped_line(json, &host, n));
                    }
                    let _ = done_tx.send(());
                });
            if spawned.is_err() {
                drop(tx);
                return write_stderr(&line);
            }
            *tx = Some(send);
            *self.sink.done.lock().unwrap_or_else(|e| e.into_inner()) = Some(done_rx);
        }
        if let Some(Err(TrySendError::Full(_))) = tx.as_ref().map(|t| t.try_send(line)) {
            self.sink.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Let the writer finish the queued lines, waiting at most `within` (stderr may be stuck).
    pub fn flush(&self, within: Duration) {
        self.sink.closed.store(true, Ordering::SeqCst);
        let tx = self
            .sink
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(tx);
        if let Some(done) = self
            .sink
            .done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = done.recv_timeout(within);
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
            obj.insert("ts".into(), Value::from(crate::clock::unix_millis()));
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
            format!("cronlock: {}", printable(msg))
        };
        // One write per line, so lines stay whole next to the command's own stderr output.
        // Passwords never reach this point: URLs are shown redacted by structure
        // (`url::redact_url`) and Redis errors are reduced to their first line.
        let mut line = line;
        line.push('\n');
        self.emit(line);
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

/// `text` with control characters escaped (`\n`, `\u{1b}`): a KEY or a server's words can never
/// start a line of their own, forge a `cronlock:` line or drive the terminal. (JSON lines escape
/// them by themselves.)
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// A panic's message, for the one line that reports it.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
