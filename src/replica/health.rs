//! Whether this replica can start runs. A run that cannot be spawned (the binary lost its run
//! bit, `EAGAIN`, `ENOMEM`, a full fd table) or that exits with our own failure before starting
//! its command (another version of the binary replaced this one) makes the replica sick: it
//! claims nothing, tells the fleet it is full (so the others take its share at once), and says
//! why on `/readyz` and its page. Every [`PROBE_EVERY`] it probes by starting the binary a run
//! would start (`--version`, which must name this version), and serves again once that works.
//! A replica that started no run for [`IDLE_PROBE`] probes as well, so `/readyz` tells a sick
//! replica that owns no instant for a while.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::clock::Instant;
use crate::command::process::Helper;
use crate::log::Log;

use super::watched::BoardFeed;

/// How often a sick replica probes.
pub const PROBE_EVERY: Duration = Duration::from_secs(2);
/// A replica that started no run for this long probes too: one that owns no instant for a
/// while learns it cannot start runs before it wins a claim.
pub const IDLE_PROBE: Duration = Duration::from_secs(10);
/// The longest a probe may take.
const PROBE_WITHIN: Duration = Duration::from_secs(2);

/// Why this replica cannot start runs, and when it probes next.
struct Sick {
    why: String,
    probe_at: Instant,
}

impl Sick {
    fn new(why: String) -> Sick {
        Sick {
            why,
            probe_at: Instant::now() + PROBE_EVERY,
        }
    }
}

/// Whether this replica can start runs, and when it probes next.
pub(super) struct Health {
    /// This replica cannot start runs, and why.
    sick: Option<Sick>,
    /// While it can: when it probes if it starts no run before ([`IDLE_PROBE`]).
    idle_probe_at: Instant,
}

impl Health {
    /// Able to start runs, with no run started yet.
    pub(super) fn new() -> Health {
        Health {
            sick: None,
            idle_probe_at: Instant::now() + IDLE_PROBE,
        }
    }

    pub(super) fn is_sick(&self) -> bool {
        self.sick.is_some()
    }

    /// When the next probe goes.
    pub(super) fn probe_at(&self) -> Instant {
        self.sick
            .as_ref()
            .map_or(self.idle_probe_at, |s| s.probe_at)
    }

    /// A run started: no idle probe before [`IDLE_PROBE`] from now.
    pub(super) fn started_run(&mut self) {
        self.idle_probe_at = Instant::now() + IDLE_PROBE;
    }

    /// A sick replica probes when its time comes, and serves again once it can start runs; one
    /// that started no run for [`IDLE_PROBE`] probes too (so `/readyz` says it is sick before it
    /// loses a claim). `exe` is the binary its starter starts from.
    pub(super) fn probe(&mut self, exe: &Path, log: &Log, shown: &BoardFeed) {
        let now = Instant::now();
        let Some(sick) = &mut self.sick else {
            if now >= self.idle_probe_at {
                self.idle_probe_at = now + IDLE_PROBE;
                if let Err(why) = probe(exe) {
                    self.fell_sick(why, log, shown);
                }
            }
            return;
        };
        if now < sick.probe_at {
            return;
        }
        match probe(exe) {
            Ok(()) => {
                self.sick = None;
                self.started_run();
                log.info(
                    "runs_start_again",
                    "can start runs again: claiming again",
                    &[],
                );
                shown.sick(None);
            }
            Err(why) => {
                sick.probe_at = Instant::now() + PROBE_EVERY;
                if why != sick.why {
                    shown.sick(Some(&why));
                    sick.why = why;
                }
            }
        }
    }

    /// This replica cannot start runs: it claims nothing (and says it is full) until a probe
    /// shows it can.
    pub(super) fn fell_sick(&mut self, why: String, log: &Log, shown: &BoardFeed) {
        if self.sick.is_none() {
            log.error(
                "cannot_start_runs",
                &format!(
                    "{why}; claiming nothing (other replicas take its instants) and trying again \
                     every {} s",
                    PROBE_EVERY.as_secs()
                ),
            );
            shown.sick(Some(&why));
        }
        self.sick = Some(Sick::new(why));
    }
}

/// What `cronlock --version` prints for this binary.
fn our_version() -> String {
    format!("cronlock {}", env!("CARGO_PKG_VERSION"))
}

/// Start `exe --version` as a run would be started, and check that it is this version: `Err`
/// with why not.
fn probe(exe: &Path) -> Result<(), String> {
    let mut command = Command::new(exe);
    command
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = Helper::spawn(&mut command).map_err(|e| {
        format!(
            "cannot start {}: {}",
            exe.display(),
            crate::log::io_text(&e)
        )
    })?;
    let Some(status) = child.end_within(PROBE_WITHIN) else {
        return Err(format!(
            "{} --version did not end within {} s",
            exe.display(),
            PROBE_WITHIN.as_secs()
        ));
    };
    let mut said = String::new();
    if let Some(out) = child.take_stdout() {
        let _ = out.take(4096).read_to_string(&mut said);
    }
    if !status.success() {
        return Err(format!("{} --version ended with {status}", exe.display()));
    }
    if said.trim() != our_version() {
        return Err(format!(
            "{} is now another version ('{}', this replica is '{}'): restart the replica",
            exe.display(),
            said.trim().chars().take(80).collect::<String>(),
            our_version()
        ));
    }
    Ok(())
}
