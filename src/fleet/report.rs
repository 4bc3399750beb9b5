//! What a run tells the world after it ends: the `--metrics-dir` file and the `--ping` calls.
//!
//! It exists so that a run's outcome is turned into reports in one place, whatever ended it.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::cli::Cli;
use crate::exit::{self, Exit};
use crate::fleet::{metrics, ping};
use crate::host;
use crate::job::capture::Capture;
use crate::log::Log;

pub struct Report {
    pinger: Option<ping::Pinger>,
    metrics_dir: Option<PathBuf>,
    /// The command's run, when it started.
    pub run: Option<metrics::Run>,
    /// We held the lock, so this host is the one that pings.
    pub locked: bool,
    /// `--ping-body`: capture the output...
    pub wants_capture: bool,
    /// ...here, while the command runs...
    pub capture: Option<Capture>,
    /// ...and its tail once the command ended.
    pub body: Option<Vec<u8>>,
}

impl Report {
    /// The reports `cli` asks for; a `--metrics-dir` that is not a directory is an error before
    /// the lock is taken.
    pub fn new(cli: &Cli, log: &Log) -> Result<Report> {
        if let Some(dir) = cli.metrics_dir.as_deref().filter(|d| !d.is_dir()) {
            bail!(
                "--metrics-dir {} is not a directory (or CRONLOCK_METRICS_DIR)",
                dir.display()
            );
        }
        let ping = cli.ping()?;
        Ok(Report {
            pinger: ping
                .as_deref()
                .map(|url| ping::Pinger::new(url, log))
                .transpose()?,
            metrics_dir: cli.metrics_dir.clone(),
            run: None,
            locked: false,
            wants_capture: ping.is_some() && cli.ping_body,
            capture: None,
            body: None,
        })
    }

    /// The command started: the start ping, and the capture's clock.
    pub fn started(&mut self) {
        if let Some(c) = self.capture.as_mut() {
            c.started();
        }
        if let Some(p) = self.pinger.as_mut() {
            p.started();
        }
    }

    /// The run ended with `result` (attempted at `attempted`, ms since the epoch).
    pub fn tell(self, key: &str, attempted: u64, result: &Result<Exit>, log: &Log) {
        use metrics::Outcome;
        let outcome = match result {
            Err(_) => Outcome::Error,
            Ok(Exit::Conflict(_)) => Outcome::Skipped,
            Ok(Exit::LockLost) => Outcome::Lost,
            Ok(Exit::MaxRuntime) => Outcome::MaxRuntime,
            Ok(Exit::CannotExecute | Exit::NotFound) => Outcome::FailedToStart,
            Ok(_) if self.run.is_some() => Outcome::Ran,
            Ok(_) => Outcome::Error,
        };
        if let Some(dir) = &self.metrics_dir {
            let attempt = metrics::Attempt {
                outcome,
                at_ms: attempted,
                run: self.run,
            };
            if let Err(e) = metrics::write(dir, key, &host::hostname(), &attempt) {
                log.warn(
                    "metrics_failed",
                    &format!(
                        "cannot write metrics to {}: {}",
                        dir.display(),
                        crate::log::io_text(&e)
                    ),
                );
            }
        }
        if let (Some(p), true) = (self.pinger, self.locked) {
            p.finished(
                result.as_ref().map_or(exit::FAILURE, |e| e.code()),
                self.body,
            );
        }
    }
}
