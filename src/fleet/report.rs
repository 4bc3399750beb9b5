//! What a run tells the world after it ends: the `--metrics-dir` file and the `--ping` calls.
//!
//! It exists so that a run's outcome is turned into reports in one place, whatever ended it: the
//! run hands over a [`RunOutcome`] value and the reports consume it.

use std::path::PathBuf;

use anyhow::Result;

use crate::exit::{self, Exit};
use crate::fleet::{metrics, ping};
use crate::host;
use crate::log::Log;

/// What a run tells the world once it ended.
#[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Reports {
    /// `--metrics-dir`, a directory (checked).
    pub metrics_dir: Option<PathBuf>,
    /// `--ping` (read from `--ping-url-file` when given that way).
    pub ping_url: Option<String>,
    /// `--ping-body`: send the tail of the output with the end ping.
    pub ping_body: bool,
}

impl Reports {
    /// The output must be captured for the end ping.
    pub fn wants_body(&self) -> bool {
        self.ping_url.is_some() && self.ping_body
    }
}

/// How a run went, as the reports need it.
pub struct RunOutcome {
    /// The exit status, or the error that ended cronlock (status 125).
    pub result: Result<Exit>,
    /// We held the lock, so this host is the one that pings.
    pub locked: bool,
    /// The command's run, when it started.
    pub run: Option<metrics::Ran>,
    /// `--ping-body`: the tail of the command's output.
    pub body: Option<Vec<u8>>,
    /// KEY was suspended (`--suspend`) since this time (Unix ms; 0: not said), so nothing ran.
    pub suspended: Option<u64>,
}

/// The reports a run asked for, ready to tell.
pub struct Report {
    pinger: Option<ping::Pinger>,
    metrics_dir: Option<PathBuf>,
}

impl Report {
    /// The reports `reports` asks for (a `--ping` URL is checked here).
    pub fn new(reports: &Reports, log: &Log) -> Result<Report> {
        Ok(Report {
            pinger: reports
                .ping_url
                .as_deref()
                .map(|url| ping::Pinger::new(url, log))
                .transpose()?,
            metrics_dir: reports.metrics_dir.clone(),
        })
    }

    /// The metrics file alone, for what a replica tells of a job it did not run (a lost claim,
    /// a missed instant): no `--ping` is sent then, so no HTTP client is made.
    pub fn metrics_only(reports: &Reports) -> Report {
        Report {
            pinger: None,
            metrics_dir: reports.metrics_dir.clone(),
        }
    }

    /// KEY's command started as `run_id`, the `attempt`-th at its instant: the start ping, and
    /// `cronlock_running` 1 in the metrics file.
    pub fn started(&mut self, key: &str, run_id: &str, attempt: u32, log: &Log) {
        if let Some(p) = self.pinger.as_mut() {
            p.started(run_id);
        }
        if let Some(dir) = &self.metrics_dir {
            let written = metrics::write_started(dir, key, &host::hostname(), attempt);
            metrics_failed(dir, written, log);
        }
    }

    /// The run attempted at `attempted` (ms since the epoch) ended as `outcome`.
    pub fn tell(self, key: &str, attempted: u64, outcome: &RunOutcome, log: &Log) {
        use metrics::Outcome;
        let kind = match &outcome.result {
            Err(_) => Outcome::Error,
            Ok(Exit::Conflict(_)) => Outcome::Skipped,
            Ok(Exit::LockLost) => Outcome::Lost,
            Ok(Exit::MaxRuntime) => Outcome::MaxRuntime,
            Ok(Exit::CannotExecute | Exit::NotFound) => Outcome::FailedToStart,
            Ok(_) if outcome.run.is_some() => Outcome::Ran,
            Ok(_) => Outcome::Error,
        };
        if let Some(dir) = &self.metrics_dir {
            let attempt = metrics::MetricsAttempt {
                outcome: kind,
                at_ms: attempted,
                run: outcome.run,
                suspended: outcome.suspended,
            };
            let written = metrics::write(dir, key, &host::hostname(), &attempt);
            metrics_failed(dir, written, log);
        }
        if let (Some(p), true) = (self.pinger, outcome.locked) {
            let status = outcome.result.as_ref().map_or(exit::FAILURE, |e| e.code());
            p.finished(status, outcome.body.clone());
        }
    }
}

impl Report {
    /// A `--crontab` instant no replica had room to start in time (`at_ms`): the metrics file
    /// says `missed`.
    pub fn missed(&self, key: &str, at_ms: u64, log: &Log) {
        if let Some(dir) = &self.metrics_dir {
            let attempt = metrics::MetricsAttempt {
                outcome: metrics::Outcome::Missed,
                at_ms,
                run: None,
                suspended: None,
            };
            let written = metrics::write(dir, key, &host::hostname(), &attempt);
            metrics_failed(dir, written, log);
        }
    }
}

/// A metrics file that could not be written: a warning, never the run's failure.
fn metrics_failed(dir: &std::path::Path, written: std::io::Result<()>, log: &Log) {
    if let Err(e) = written {
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
