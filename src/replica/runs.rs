//! The runs a replica started: each is the run `cronlock --schedule ... KEY -c ...` makes, forked
//! by the replica's starter (`starter.rs`, `run/starter.rs`), handed the lock the replica claimed
//! on a channel of its own ([`crate::handover`]), and tied to the replica by that channel
//! (its end asks the run to end), and to its starter, which guards its command
//! (`command::oversight`): a starter killed asks its runs to end, and one replaced (it did not
//! answer a start) is let go, not killed, and kept until its runs have ended. Its reports
//! (started, release, ended) are read on a thread and reach the loop as typed values; its output
//! is relayed line by line with its KEY; its end comes from the starter, which reaps it, or,
//! once that starter is gone, from its channel alone.
//!
//! The replica renews a run's lock when the run asks (`renew`: the runs that ask together go to
//! the claims thread together, one pipeline per server list) and tells it `renewed` once Redis
//! confirmed it ([`Runs::renewed`]); a run renews by itself only when no renewal came in time.
//!
//! A run is over when its process was reaped (or its starter is gone) and its channel closed
//! (the channel stays open while the run's guard lives, so a run killed with its command still
//! alive keeps its place until the guard has stopped that command).

use std::collections::HashMap;

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Result};

use crate::clock::Instant;
use crate::command::kept::Kept;
use crate::config::CronJob;
use crate::handover::{report_in, Handover, ReplicaSide, RunReport, MAX_MESSAGE};
use crate::log::Log;
use crate::replica::output;
use crate::replica::relay::{Relay, Source};
use crate::replica::starter::{Asked, Starter, StarterNews};
use crate::replica::watches::Watches;
use crate::signals;
use crate::starting::message::Plan;
use crate::store::lock::Held;

/// The binary a replica starts its starter (and its health probes) from: the image it runs
/// itself. The file at its path may have been replaced since the replica started (a package
/// upgraded in place), and a starter of another version would not speak this replica's
/// messages; `/proc/self/exe` names this process's own image, whatever became of the path (in
/// the spawned child it is still the parent's image until `execve`). Without `/proc`, the path.
fn own_binary() -> Result<PathBuf> {
    let image = Path::new("/proc/self/exe");
    if image.exists() {
        return Ok(image.to_path_buf());
    }
    std::env::current_exe().map_err(|e| {
        anyhow!(
            "cannot find cronlock's own binary: {}",
            crate::log::io_text(&e)
        )
    })
}

/// The replica's own settings and test hooks: not the run's.
fn not_for_runs() -> Vec<&'static str> {
    let options = crate::config::REPLICA_OPTIONS.iter().map(|o| o.variable);
    options.chain(crate::hooks::REPLICA).collect()
}

/// A starter with no run left that was asked for none this long is let go (it exits at once),
/// and spawned again at the next run: a replica whose jobs are far apart keeps no second process.
const STARTER_IDLE: Duration = Duration::from_secs(60);

/// What a run's channel said, for the loop.
struct Heard {
    pid: u32,
    /// A report, or `None` at the channel's end.
    report: Option<RunReport>,
}

/// A report a run sent, with the run (still supervised) that sent it.
pub struct RunHeard<'a> {
    pub run: &'a mut Spawned,
    /// A report, or `None` at the channel's end.
    pub report: Option<RunReport>,
}

/// A run this replica supervises.
pub struct Spawned {
    pub key: String,
    pub instant: Option<i64>,
    /// The instant is a manual one (`--trigger`).
    pub manual: bool,
    pub attempt: u32,
    pub fence: i64,
    pub ttl: Duration,
    /// The lock it was handed, and its job's configuration: released by the replica when the run
    /// and its guard are gone without having reported an end.
    pub held: Box<Held>,
    pub config: std::sync::Arc<crate::config::RunConfig>,
    /// The replica's writing end of the channel, for the answer to the run's `release`.
    pub reply: Option<ReplicaSide>,
    pid: u32,
    /// The starter that forked it.
    starter: u32,
    /// The replica watches its lock (`watches.rs`), not the run.
    watched: bool,
    /// We signalled it (the drain ran out, or a second SIGTERM).
    pub stopped: bool,
    /// Its command started (reported).
    pub started: bool,
    /// Its end was reported.
    pub ended: bool,
    /// Its process was reaped, with this status.
    pub exited: Option<ExitStatus>,
    /// Its starter is gone: nobody says when its process ends (its channel's end does).
    pub orphaned: bool,
    /// Its channel reached end of file.
    pub closed: bool,
    /// A renewal it asked for was asked of the claims thread and not answered yet.
    pub renewing: bool,
    /// Its command's last lines as the output relay reads them (`--keep-output`), added to its
    /// record at its release.
    pub kept: Arc<Mutex<Kept>>,
}

impl Spawned {
    /// The run's process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Over: reaped (or orphaned, and reaped by another process than this replica) and its
    /// channel closed.
    pub fn over(&self) -> bool {
        let reaped_elsewhere = self.orphaned && std::process::id() != 1;
        (self.exited.is_some() || reaped_elsewhere) && self.closed
    }
}

/// The runs this replica started and supervises, the binary they start from, and the channel
/// their reports reach the loop on.
pub struct Runs {
    /// cronlock's own binary, as a run starts it.
    exe: PathBuf,
    /// `--log-format json`: a run's relayed output lines are JSON too.
    json: bool,
    by_pid: HashMap<u32, Spawned>,
    heard: (Sender<Heard>, Receiver<Heard>),
    /// The starter the runs are forked by (spawned at a run when there is none: the first, the
    /// first after it was gone or let go), and what it says of them.
    starter: Option<Starter>,
    /// Starters replaced while runs they forked may still work (their commands, which they
    /// guard, with them), reaped once they exit.
    retired: Vec<Starter>,
    /// When it was last asked to start a run, and how long it is kept idle.
    starter_used: Instant,
    starter_idle: Duration,
    news: (Sender<StarterNews>, Receiver<StarterNews>),
    /// The watch of the runs' locks.
    watches: Watches,
    /// The threads that read every run's output, and every run's reports.
    outputs: Relay,
    reports: Relay,
    /// A run had to be stopped (the replica's exit status says so).
    interrupted: bool,
    /// The test hook [`crate::hooks::HOLD_AFTER_CLAIM`]: where to say a claim was won, then stop.
    hold: Option<PathBuf>,
}

impl Runs {
    /// None yet; `Err` when cronlock cannot find its own binary.
    pub fn new(json: bool, log: &Log) -> Result<Runs> {
        let exe = own_binary()?;
        Ok(Runs {
            exe,
            json,
            by_pid: HashMap::new(),
            heard: mpsc::channel(),
            starter: None,
            retired: Vec::new(),
            starter_used: Instant::now(),
            starter_idle: crate::hooks::millis(crate::hooks::STARTER_IDLE_MS)
                .unwrap_or(STARTER_IDLE),
            news: mpsc::channel(),
            watches: Watches::new(log),
            outputs: Relay::start("output")?,
            reports: Relay::start("reports")?,
            interrupted: false,
            hold: crate::hooks::file(crate::hooks::HOLD_AFTER_CLAIM),
        })
    }

    /// The binary a run starts (what a health probe starts too).
    pub fn exe(&self) -> &Path {
        &self.exe
    }

    pub fn len(&self) -> usize {
        self.by_pid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_pid.is_empty()
    }

    /// Whether a run had to be stopped.
    pub fn interrupted(&self) -> bool {
        self.interrupted
    }

    /// Ask for the run of `job` that takes over `held` to be started; [`Runs::started`] takes
    /// the answer. The starts won together are all asked before any answer is read, so the
    /// starter forks each as soon as it forked the one before.
    pub fn start(&mut self, job: &CronJob, held: &Held) -> Result<Starting> {
        if let Some(path) = &self.hold {
            let _ = std::fs::write(path, &job.key);
            loop {
                std::thread::park();
            }
        }
        if !self.starter.as_mut().is_some_and(Starter::usable) {
            self.retire_starter();
            let s = Starter::spawn(&self.exe, &not_for_runs(), &self.news.0)
                .map_err(|e| anyhow!("cannot start its starter: {e:#}"))?;
            self.starter = Some(s);
        }
        let Some(starter) = self.starter.as_mut() else {
            return Err(anyhow!("no starter"));
        };
        self.starter_used = Instant::now();
        ask_start(starter, job, held)
    }

    /// The starter's answer to `starting`: the run supervised from now on, handed its lock.
    pub fn started(&mut self, starting: Starting, log: &Log) -> Result<()> {
        let Some(starter) = self
            .starter
            .as_mut()
            .filter(|s| s.pid() == starting.starter)
        else {
            return Err(anyhow!("its starter is gone"));
        };
        let relays = Relays {
            outputs: &self.outputs,
            reports: &self.reports,
            heard: &self.heard.0,
            json: self.json,
        };
        let run = hand_over(starter, starting, &relays, log)?;
        self.by_pid.insert(run.pid(), run);
        Ok(())
    }

    /// How run `pid`'s renewal sent at `sent` went: confirmed (the run is told `renewed`), not
    /// ours (the run is told its lock changed: it renews by itself and finds it lost), or failed
    /// (the run renews by itself when no answer came in time).
    pub fn renewed(&mut self, pid: u32, sent: Instant, result: Result<bool, String>) {
        let Some(run) = self.by_pid.get_mut(&pid) else {
            return;
        };
        run.renewing = false;
        // Never waits: a run that does not read its channel renews by itself.
        match (&run.reply, result) {
            (Some(reply), Ok(true)) => reply.renewed(sent),
            (Some(reply), Ok(false)) => reply.changed(),
            _ => {}
        }
    }

    /// The next report a run sent.
    pub fn next_report(&mut self) -> Option<RunHeard<'_>> {
        loop {
            let Heard { pid, report } = self.heard.1.try_recv().ok()?;
            // (A report of a run already forgotten is dropped.)
            let Some(run) = self.by_pid.get_mut(&pid) else {
                continue;
            };
            // Its lock is watched from a little after its command started until its release.
            match &report {
                Some(RunReport::Started { .. }) if run.watched => {
                    if let Some(reply) = &run.reply {
                        self.watches.add(pid, &run.config, &run.held, reply);
                    }
                }
                Some(RunReport::Release(_)) | None => self.watches.remove(pid),
                _ => {}
            }

            return self
                .by_pid
                .get_mut(&pid)
                .map(|run| RunHeard { run, report });
        }
    }

    /// Note the runs whose process ended (their starter says so; once it is gone, their channel
    /// says it, and this replica reaps those it inherited as PID 1).
    pub fn reap(&mut self) {
        while let Ok(news) = self.news.1.try_recv() {
            match news {
                StarterNews::Exited { pid, status } => {
                    if let Some(run) = self.by_pid.get_mut(&pid) {
                        run.exited = Some(status);
                    }
                }
                StarterNews::Gone { pid } => {
                    if self.starter.as_ref().is_some_and(|s| s.pid() == pid) {
                        self.retire_starter();
                    }
                    for run in self.by_pid.values_mut() {
                        run.orphaned |= run.starter == pid && run.exited.is_none();
                    }
                }
            }
        }
        self.reap_orphans();
        self.let_idle_starter_go();
        self.retired.retain_mut(Starter::running);
    }

    /// Give up the current starter (gone, or replaced): kept until its process exits, never
    /// killed while runs it forked may still work, since it guards their commands
    /// (`command::oversight`); the next run gets a new one.
    fn retire_starter(&mut self) {
        if let Some(mut old) = self.starter.take() {
            old.let_go();
            if old.running() {
                self.retired.push(old);
            }
        }
    }

    /// As PID 1 (a container's entrypoint), the runs whose starter is gone are this replica's
    /// children: each is reaped once it ended (its channel closes as it ends), never waited for.
    /// Any other replica's orphaned runs are reaped by whoever inherited them.
    fn reap_orphans(&mut self) {
        if std::process::id() != 1 {
            return;
        }
        for (pid, run) in self.by_pid.iter_mut() {
            if run.orphaned && run.closed && run.exited.is_none() {
                let pid = nix::unistd::Pid::from_raw(*pid as i32);
                let now = Some(nix::sys::wait::WaitPidFlag::WNOHANG);
                if let Ok(status) = nix::sys::wait::waitpid(pid, now) {
                    run.exited = wait_status(status);
                }
            }
        }
    }

    /// Let the starter go once it has no run left and was asked for none for [`STARTER_IDLE`]:
    /// dropped, its link closes and it exits at once (a run it forked is supervised until its
    /// starter says it ended, so none can be left).
    fn let_idle_starter_go(&mut self) {
        let Some(pid) = self.starter.as_ref().map(Starter::pid) else {
            return;
        };
        if self.starter_used.elapsed() >= self.starter_idle
            && !self.by_pid.values().any(|r| r.starter == pid)
        {
            self.starter = None;
        }
    }

    /// The runs that are over, no longer supervised; one this replica stopped is said.
    pub fn take_over(&mut self, log: &Log) -> Vec<Spawned> {
        let over: Vec<u32> = self
            .by_pid
            .iter()
            .filter(|(_, r)| r.over())
            .map(|(p, _)| *p)
            .collect();
        let over: Vec<Spawned> = over
            .into_iter()
            .filter_map(|pid| self.by_pid.remove(&pid))
            .collect();
        for run in &over {
            self.watches.remove(run.pid);
        }
        for run in over.iter().filter(|r| r.stopped) {
            self.interrupted = true;
            let status = run.exited.map(|s| s.to_string()).unwrap_or_default();
            log.warn(
                "run_stopped",
                &format!("{}: its run was stopped ({status})", run.key),
            );
        }
        over
    }

    /// Send `sig` to every run's cronlock (which passes SIGTERM on to its command; SIGKILL leaves
    /// the command to the run's guard).
    pub fn stop(&mut self, sig: libc::c_int, log: &Log) {
        for (pid, run) in self.by_pid.iter_mut().filter(|(_, r)| r.exited.is_none()) {
            if !run.stopped {
                log.warn(
                    "stopping_run",
                    &format!(
                        "{}: stopping its run ({}): the drain is over",
                        run.key,
                        signals::name(sig)
                    ),
                );
            }
            run.stopped = true;
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid as i32),
                nix::sys::signal::Signal::try_from(sig).ok(),
            );
        }
    }
}

/// A run asked of the starter, not yet answered: its lock, its job, and the replica's ends of its
/// channel and output pipes.
pub struct Starting {
    asked: Asked,
    starter: u32,
    key: String,
    config: std::sync::Arc<crate::config::RunConfig>,
    held: Box<Held>,
    channel: UnixStream,
    out: std::io::PipeReader,
    err: std::io::PipeReader,
}

impl Starting {
    /// The configuration of the job whose claim it would take over (undone when the run does
    /// not start).
    pub fn config(&self) -> std::sync::Arc<crate::config::RunConfig> {
        self.config.clone()
    }

    /// The lock of the claim it would take over.
    pub fn held(&self) -> Box<Held> {
        self.held.clone()
    }
}

/// Ask `starter` for the run of `job` that takes over `held`, with its channel and pipes.
fn ask_start(starter: &mut Starter, job: &CronJob, held: &Held) -> Result<Starting> {
    let io = |e: std::io::Error| anyhow!(crate::log::io_text(&e));
    let (channel, theirs) = UnixStream::pair().map_err(io)?;
    let (out, out_w) = std::io::pipe().map_err(io)?;
    let (err, err_w) = std::io::pipe().map_err(io)?;
    let fds = [OwnedFd::from(theirs), out_w.into(), err_w.into()];
    let plan = Plan::of(&job.run)?;
    let asked = starter.ask(&job.key, plan, [&fds[0], &fds[1], &fds[2]])?;
    // (The run will have its copies: the channel's end of file, and the pipes', are the run's.)
    drop(fds);
    Ok(Starting {
        asked,
        starter: starter.pid(),
        key: job.key.clone(),
        config: job.run.config.clone(),
        held: Box::new(held.clone()),
        channel,
        out,
        err,
    })
}

/// The run `starting` asked of `starter`, once it says it forked it. A run that started is
/// never lost: once it exists, trouble with its output is a warning and the run is returned all
/// the same. The lock is written to its channel only once the starter said it forked the run: a
/// run it never answered for gets no lock.
fn hand_over(
    starter: &mut Starter,
    starting: Starting,
    relays: &Relays<'_>,
    log: &Log,
) -> Result<Spawned> {
    let io = |e: std::io::Error| anyhow!(crate::log::io_text(&e));
    let Starting {
        asked,
        key,
        config,
        held,
        channel: ours,
        out,
        err,
        ..
    } = starting;
    let pid = starter.answer(&asked)?;
    let reading = ours.try_clone().map_err(io)?;
    let mut reply = ReplicaSide::new(ours);
    let watched = Watches::covers(&config);
    let handover = Handover::from_held(&key, &held, starter.pid(), watched);
    if let Err(e) = reply.hand_over(&handover) {
        // It gets no lock and ends; the replica releases the lock when it has.
        log.warn(
            "handover_lost",
            &format!(
                "{key}: cannot hand its run the lock: {}",
                crate::log::io_text(&e)
            ),
        );
    }
    let kept = Arc::new(Mutex::new(Kept::new(config.keep_output.bytes)));
    relays.relay(pid, &key, [out, err], reading, &kept);
    Ok(Spawned {
        instant: held.instant,
        manual: held.manual,
        attempt: held.attempt,
        fence: held.fence,
        ttl: held.ttl,
        key,
        held,
        config,
        reply: Some(reply),
        pid,
        starter: starter.pid(),
        watched,
        stopped: false,
        started: false,
        ended: false,
        exited: None,
        orphaned: false,
        closed: false,
        renewing: false,
        kept,
    })
}

/// The replica's relay threads, and where reports go.
struct Relays<'a> {
    outputs: &'a Relay,
    reports: &'a Relay,
    heard: &'a Sender<Heard>,
    json: bool,
}

impl Relays<'_> {
    /// Relay run `pid`'s stdout and stderr line by line with its KEY, and read its reports on
    /// `channel` until its end.
    fn relay(
        &self,
        pid: u32,
        key: &str,
        [out, err]: [std::io::PipeReader; 2],
        channel: UnixStream,
        kept: &Arc<Mutex<Kept>>,
    ) {
        for (from, stream) in [
            (OwnedFd::from(out), output::OutputStream::Stdout),
            (OwnedFd::from(err), output::OutputStream::Stderr),
        ] {
            let (key, json, kept) = (key.to_string(), self.json, kept.clone());
            self.outputs.add(Source {
                fd: from,
                on_line: Box::new(move |line| {
                    if let Some(line) = line {
                        kept.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(stream.index(), line);
                        let text = String::from_utf8_lossy(line);
                        let text = text.strip_suffix('\n').unwrap_or(&text);
                        output::write_line(stream, &key, text, json);
                    }
                }),
                max_line: output::MAX_LINE,
            });
        }
        let heard = self.heard.clone();
        let answering = channel.try_clone().ok().map(ReplicaSide::new);
        self.reports.add(Source {
            fd: OwnedFd::from(channel),
            on_line: Box::new(move |line| {
                let report = match line {
                    Some(line) => match report_in(line) {
                        Some(report) => Some(report),
                        // (A line that is not a report is skipped.)
                        None => return,
                    },
                    None => None,
                };
                // Told at once that the replica lives and carries its release out (never
                // blocking this thread: a run that does not read loses only this line).
                if let (Some(RunReport::Release(_)), Some(side)) = (&report, &answering) {
                    side.releasing();
                }
                let _ = heard.send(Heard { pid, report });
                signals::wake_main();
            }),
            // Bounded per line, not in all: a long run asks a renewal every interval for as
            // long as it runs (and only our own binary writes on the channel).
            max_line: MAX_MESSAGE,
        });
    }
}

/// A wait status as std's [`ExitStatus`] (an exit or a death by a signal; `None` for anything
/// else).
fn wait_status(status: nix::sys::wait::WaitStatus) -> Option<ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    match status {
        nix::sys::wait::WaitStatus::Exited(_, code) => {
            Some(ExitStatus::from_raw((code & 0xff) << 8))
        }
        nix::sys::wait::WaitStatus::Signaled(_, sig, _) => Some(ExitStatus::from_raw(sig as i32)),
        _ => None,
    }
}
