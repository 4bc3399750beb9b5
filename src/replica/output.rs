//! A run's output, attributed to its KEY: every line of the run's stdout and stderr is written
//! whole, prefixed `[KEY] ` (or, with `--log-format json`, as `{"key", "stream", "line"}`), so
//! lines of jobs running side by side never interleave. It is output only: what the run did
//! reaches the replica on its channel ([`crate::handover`]), never through these lines.

use std::io::Write;
use std::sync::Mutex;

use serde_json::json;

/// One writer at a time, so a line is never cut by another job's.
static WRITE: Mutex<()> = Mutex::new(());

/// The longest line relayed whole; a longer one is cut into pieces of this size.
pub const MAX_LINE: usize = 64 * 1024;

/// Which of the run's streams.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

impl OutputStream {
    /// 0 for stdout, 1 for stderr, as `command::kept` numbers them.
    pub fn index(self) -> usize {
        match self {
            OutputStream::Stdout => 0,
            OutputStream::Stderr => 1,
        }
    }
}

/// One line of a job's output, whole.
pub fn write_line(stream: OutputStream, key: &str, line: &str, json_out: bool) {
    let mut text = if json_out {
        json!({
            "ts": crate::clock::unix_millis(),
            "key": key,
            "stream": if stream == OutputStream::Stdout { "stdout" } else { "stderr" },
            "line": line,
        })
        .to_string()
    } else {
        format!("[{key}] {line}")
    };
    text.push('\n');
    let _held = WRITE.lock().unwrap_or_else(|e| e.into_inner());
    let _ = match stream {
        OutputStream::Stdout => std::io::stdout().lock().write_all(text.as_bytes()),
        OutputStream::Stderr => std::io::stderr().lock().write_all(text.as_bytes()),
    };
}
