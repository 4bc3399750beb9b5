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

/// How often a sick replica probes.
pub const PROBE_EVERY: Duration = Duration::from_secs(2);
/// A replica that started no run for this long probes too: one that owns no instant for a
/// while learns it cannot start runs before it wins a claim.
pub const IDLE_PROBE: Duration = Duration::from_secs(10);
/// The longest a probe may take.
const PROBE_WITHIN: Duration = Duration::from_secs(2);

/// Why this replica cannot start runs, and when it probes next.
pub struct Sick {
    pub why: String,
    pub probe_at: Instant,
}

impl Sick {
    pub fn new(why: String) -> Sick {
        Sick {
            why,
            probe_at: Instant::now() + PROBE_EVERY,
        }
    }
}

/// What `cronlock --version` prints for this binary.
fn our_version() -> String {
    format!("cronlock {}", env!("CARGO_PKG_VERSION"))
}

/// Start `exe --version` as a run would be started, and check that it is this version: `Err`
/// with why not.
pub fn probe(exe: &Path) -> Result<(), String> {
    let mut child = Command::new(exe)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start {}: {}",
                exe.display(),
                crate::log::io_text(&e)
            )
        })?;
    let deadline = Instant::now() + PROBE_WITHIN;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} --version did not end within {} s",
                    exe.display(),
                    PROBE_WITHIN.as_secs()
                ));
            }
        }
    };
    let mut said = String::new();
    if let Some(out) = child.stdout.take() {
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
