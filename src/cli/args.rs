//! The clap definition: every option, its variable, its default and its help text. One source for
//! `--help`, the man page, the shell completions and the exit-status table.

use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{ArgGroup, Parser};

use crate::cli::help::after_long_help;
use crate::cli::mode::Mode;
use crate::duration::{self, Span};

/// The default Redis URL when neither `--redis-url`, `CRONLOCK_REDIS_URL` nor `REDIS_URL` is set.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// Run a command under a cluster-wide lock held in Redis.
///
/// cronlock takes the lock KEY atomically, runs COMMAND while holding it, releases it, and exits with
/// the command's status. When the lock is held elsewhere the command does not run and cronlock exits
/// with the -E status (0 by default, since on a fleet "another host runs this slot" is the normal
/// outcome). Every option except -c and the modes --status, --list, --force-release, --suspend and
/// --resume can also be set from the environment variable shown; an option on the command line
/// wins over its variable.
#[derive(Debug, Parser)]
#[command(
    name = "cronlock",
    version,
    after_long_help = after_long_help(),
    override_usage = "cronlock [OPTIONS] <KEY> [--] <COMMAND> [ARGS]...\n       \
                      cronlock [OPTIONS] <KEY> -c <SHELL_COMMAND>\n       \
                      cronlock --status [--json] <KEY>\n       \
                      cronlock --check [--max-age <DURATION>] [--schedule <CRON>] [--json] <KEY>\n       \
                      cronlock --list [--json]\n       \
                      cronlock --force-release <KEY>\n       \
                      cronlock --suspend [--reason <TEXT>] [--for <DURATION>] <KEY>\n       \
                      cronlock --resume <KEY>\n       \
                      cronlock --trigger [--reason <TEXT>] [--wait <DURATION>] <KEY>\n       \
                      cronlock --next <CRON> [--count <N>] [--key <KEY>] [--from <TIME>] [--json]\n       \
                      cronlock --crontab <FILE> [--max-jobs <N>] [--drain <DURATION>] [--listen <ADDR>]\n       \
                      cronlock --crontab <FILE> --test",
    group(ArgGroup::new("admin").args(Mode::flags().filter(|f| f.mode != Mode::Crontab).map(|f| f.id))),
    group(ArgGroup::new("asking").args(["suspend", "trigger"]))
)]
pub struct Cli {
    /// Redis URL: redis://[user][:password@]host[:port][/db], rediss://... (TLS),
    /// redis+unix:///path, redis+sentinel://[user][:password@]host[:port][,host...]/SERVICE[/db]
    /// or redis+cluster://[user][:password@]host:port[,host:port...]; repeat it (or separate URLs
    /// with spaces in the variable) for a quorum of independent masters
    ///
    /// Falls back to REDIS_URL, then to redis://127.0.0.1:6379. rediss+sentinel:// and
    /// rediss+cluster:// use TLS; ?sentinel_username=...&sentinel_password=... authenticate to the
    /// sentinels (the userinfo is for the data nodes). With several URLs the lock is held when a
    /// majority of them granted it.
    // The value may hold a password: --help must not show it.
    #[arg(
        short = 'u',
        long,
        env = "CRONLOCK_REDIS_URL",
        value_name = "URL",
        hide_env_values = true,
        action = clap::ArgAction::Append
    )]
    pub redis_url: Vec<String>,

    /// Read the Redis URL(s) from this file instead (surrounding whitespace trimmed; several URLs
    /// separated by whitespace), so no password shows in any command line or environment: a
    /// Docker or Kubernetes secret mounted as a file, owned by this user or root and writable by
    /// nobody else (as a crontab). A flag wins over a variable (-u over
    /// CRONLOCK_REDIS_URL_FILE, --redis-url-file over CRONLOCK_REDIS_URL); both flags, or both
    /// variables, are refused
    #[arg(long, env = "CRONLOCK_REDIS_URL_FILE", value_name = "PATH",
          value_hint = clap::ValueHint::FilePath)]
    pub redis_url_file: Option<std::path::PathBuf>,

    /// For rediss://: trust the CA certificates in this PEM file instead of the system's store
    #[arg(long, env = "CRONLOCK_TLS_CA_CERT", value_name = "FILE",
          value_hint = clap::ValueHint::FilePath)]
    pub tls_ca_cert: Option<std::path::PathBuf>,

    /// For rediss://: client certificate (PEM) for servers that require mutual TLS; needs
    /// --tls-key
    #[arg(long, env = "CRONLOCK_TLS_CERT", value_name = "FILE",
          value_hint = clap::ValueHint::FilePath)]
    pub tls_cert: Option<std::path::PathBuf>,

    /// For rediss://: the private key (PEM) of --tls-cert
    #[arg(long, env = "CRONLOCK_TLS_KEY", value_name = "FILE",
          value_hint = clap::ValueHint::FilePath)]
    pub tls_key: Option<std::path::PathBuf>,

    /// Lock expiry in Redis; it only matters when the holder dies
    #[arg(short, long, env = "CRONLOCK_TTL", value_name = "DURATION", default_value = "30s",
          value_parser = duration::positive, allow_hyphen_values = true)]
    pub ttl: Span,

    /// How long to wait for a busy lock before giving up (0: do not wait)
    #[arg(
        short,
        long,
        env = "CRONLOCK_WAIT",
        value_name = "DURATION",
        default_value = "0",
        allow_hyphen_values = true
    )]
    pub wait: Span,

    /// Do not wait for a busy lock, like flock -n (same as --wait 0)
    #[arg(short, long, env = "CRONLOCK_NONBLOCK", value_parser = switch,
          default_value_t = false, num_args = 0, default_missing_value = "true")]
    pub nonblock: bool,

    /// Time between SIGTERM and SIGKILL when cronlock stops the command [default: 5s, at most
    /// a quarter of --ttl]
    ///
    /// An explicit value must be at most half of --ttl: the command must be gone before the lock
    /// can expire.
    #[arg(
        long,
        env = "CRONLOCK_GRACE",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub grace: Option<Span>,

    /// Stop the command (SIGTERM, then SIGKILL after --grace) when it runs longer; exit 124
    /// (0: no limit)
    #[arg(
        long,
        env = "CRONLOCK_MAX_RUNTIME",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub max_runtime: Option<Span>,

    /// Keep the lock until at least this long after it was taken, even when the command
    /// finishes sooner
    ///
    /// Hosts fire the same cron line seconds apart (clock skew, busy schedulers); a short job
    /// released at once would let a lagging host run it again. Rule of thumb: a bit less than the
    /// schedule period (e.g. 4m for a job every 5 minutes).
    #[arg(
        long,
        env = "CRONLOCK_MIN_HOLD",
        value_name = "DURATION",
        default_value = "0",
        allow_hyphen_values = true
    )]
    pub min_hold: Span,

    /// Let up to N hosts hold KEY at once (a semaphore), each with a slot of its own: the command
    /// gets CRONLOCK_SLOT (0..N-1). Every host must give the same N. With --schedule, only under
    /// --overlap allow: at most N instants run at once
    #[arg(long, env = "CRONLOCK_LIMIT", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=crate::store::keys::MAX_LIMIT as i64))]
    pub limit: u32,

    /// Run once per instant of this cron schedule across the fleet: a host firing for an
    /// instant that already ran skips (exit -E), even after the lock was released
    ///
    /// The same expression as the crontab line, CronJob or timer: 5 fields, or 6 with seconds
    /// first; ranges, steps, lists, names, @hourly/@daily/... A CRON_TZ=Zone or TZ=Zone prefix
    /// sets the time zone, else TZ or the system's. The run belongs to the instant nearest to
    /// Redis's clock, so host clock skew does not matter.
    #[arg(long, env = "CRONLOCK_SCHEDULE", value_name = "CRON", value_parser = schedule)]
    pub schedule: Option<crate::fleet::schedule::Schedule>,

    /// With --schedule: start each instant's run an offset after it, drawn from KEY within
    /// DURATION (the same on every host and after every restart), so jobs due at the same
    /// instant do not all start at once; shorter than the schedule's period. The instant keeps
    /// its name (CRONLOCK_INSTANT, the ledger)
    #[arg(long, env = "CRONLOCK_JITTER", value_name = "DURATION",
          value_parser = duration::positive, allow_hyphen_values = true, requires = "schedule")]
    pub jitter: Option<Span>,

    /// With --schedule: what an instant does that finds the lock still held by an earlier
    /// instant's run: skip (recorded skipped), queue (the first waits and starts as soon as
    /// that run ends; a further one is skipped), replace (the earlier run is stopped, SIGTERM
    /// then SIGKILL after --grace, and recorded replaced; this one starts once it is gone) or
    /// allow (each instant runs under a lock of its own, at most --limit at once, 64 without
    /// one)
    #[arg(long, env = "CRONLOCK_OVERLAP", value_name = "POLICY", value_parser = overlap,
          default_value = "skip", requires = "schedule")]
    pub overlap: crate::store::overlap::Overlap,

    /// With --schedule: run the latest instant within DURATION before now (Redis's clock) that
    /// has not run yet, once; older ones nobody ran are recorded as missed, never run
    ///
    /// Fire more often than the schedule (`*/5 * * * *` for `0 2 * * *`): a firing with nothing
    /// due costs one round trip and prints nothing. Between 1s and 10 years.
    #[arg(long, env = "CRONLOCK_CATCH_UP", value_name = "DURATION", value_parser = catch_up,
          allow_hyphen_values = true)]
    pub catch_up: Option<Span>,

    /// With --catch-up: run an instant whose attempt failed (non-zero exit) or was abandoned
    /// (its host died) up to N more times, by later firings inside the window [default: 0]
    #[arg(long, env = "CRONLOCK_RETRIES", value_name = "N", value_parser = retries,
          allow_hyphen_values = true)]
    pub retries: Option<u32>,

    /// Exit status when the lock is held elsewhere (or the instant already ran, nothing is due,
    /// KEY is suspended) and the command does not run
    #[arg(
        short = 'E',
        long,
        env = "CRONLOCK_CONFLICT_EXIT_CODE",
        value_name = "N",
        default_value_t = 0,
        allow_hyphen_values = true
    )]
    pub conflict_exit_code: u8,

    /// Run SHELL_COMMAND with /bin/sh -c instead of COMMAND
    #[arg(
        short = 'c',
        long = "command",
        value_name = "SHELL_COMMAND",
        allow_hyphen_values = true
    )]
    pub shell_command: Option<String>,

    /// Print only errors
    #[arg(short, long, env = "CRONLOCK_QUIET", value_parser = switch,
          default_value_t = false, num_args = 0, default_missing_value = "true",
          )]
    pub quiet: bool,

    /// Also report a busy lock, acquisition, release and renewals
    #[arg(short, long, env = "CRONLOCK_VERBOSE", value_parser = switch,
          default_value_t = false, num_args = 0, default_missing_value = "true")]
    pub verbose: bool,

    /// Namespace for cronlock's Redis keys
    #[arg(
        long,
        env = "CRONLOCK_PREFIX",
        value_name = "PREFIX",
        default_value = "cronlock:"
    )]
    pub prefix: String,

    /// Timeout for connecting to Redis and for each Redis command outside the watchdog
    #[arg(long, env = "CRONLOCK_CONNECT_TIMEOUT", value_name = "DURATION", default_value = "5s",
          value_parser = duration::positive, allow_hyphen_values = true)]
    pub connect_timeout: Span,

    /// Run the command only once N replicas acknowledged the lock (WAIT), and count a renewal
    /// only once N replicas have it too
    #[arg(
        long,
        env = "CRONLOCK_MIN_REPLICAS",
        value_name = "N",
        default_value_t = 0
    )]
    pub min_replicas: u32,

    /// How many past run records to keep per KEY (0: only the last run); with --status, show the
    /// kept runs (all, or the last N)
    #[arg(long, env = "CRONLOCK_HISTORY", value_name = "N", num_args = 0..=1,
          default_missing_value = "all", value_parser = history_count)]
    pub history: Option<Count>,

    /// Expire the last-run record and history this long after the last run [default: never]
    #[arg(long, env = "CRONLOCK_HISTORY_TTL", value_name = "DURATION",
          value_parser = duration::positive, allow_hyphen_values = true)]
    pub history_ttl: Option<Span>,

    /// After every attempt, write KEY's metrics to DIR/cronlock_KEY.prom (Prometheus text
    /// format, for node_exporter's textfile collector): outcome, last run, last success
    #[arg(long, env = "CRONLOCK_METRICS_DIR", value_name = "DIR",
          value_hint = clap::ValueHint::DirPath)]
    pub metrics_dir: Option<std::path::PathBuf>,

    /// Healthchecks-style pings: URL/start when the command starts, URL on exit 0, URL/N on
    /// status N; nothing when another host runs the job. Never printed; never changes the exit
    /// status
    #[arg(long = "ping", env = "CRONLOCK_PING_URL", value_name = "URL",
          value_hint = clap::ValueHint::Url, hide_env_values = true)]
    pub ping_url: Option<String>,

    /// Read the --ping URL from this file instead (surrounding whitespace trimmed), so it shows in
    /// no command line or environment; owned by this user or root, writable by nobody else
    #[arg(long, env = "CRONLOCK_PING_URL_FILE", value_name = "PATH",
          value_hint = clap::ValueHint::FilePath, conflicts_with = "ping_url")]
    pub ping_url_file: Option<std::path::PathBuf>,

    /// With --ping: send the last 10 KiB of the command's output (stdout and stderr) as the
    /// final ping's body; the output then passes through cronlock on its way to yours
    #[arg(long, env = "CRONLOCK_PING_BODY", value_parser = switch,
          default_value_t = false, num_args = 0, default_missing_value = "true")]
    pub ping_body: bool,

    /// Keep the last SIZE of the command's output (stdout and stderr, as lines marked with their
    /// stream) with the run's record in Redis, for a run that did not succeed; SIZE,all keeps
    /// every run's; 0 keeps none [default: 4KiB]
    ///
    /// SIZE is bytes, or with K/KiB or M/MiB (at most 64KiB). The output still goes where it
    /// goes, untouched: a stream that is a terminal is left alone and not kept; any other passes
    /// through cronlock on its way. What is kept lives in Redis beside the lock, readable by
    /// whoever can read the lock; --status --history and --check show it.
    #[arg(long, env = "CRONLOCK_KEEP_OUTPUT", value_name = "SIZE[,all]",
          value_parser = keep_output)]
    pub keep_output: Option<crate::config::KeepOutput>,

    /// Format of cronlock's own messages on stderr
    #[arg(long, env = "CRONLOCK_LOG_FORMAT", value_name = "FORMAT", value_enum,
          default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Show whether KEY is held, by whom, and its last run; then exit
    #[arg(long, requires = "key")]
    pub(super) status: bool,

    /// Monitoring plugin: judge KEY's last run from its record in Redis and exit 0 OK,
    /// 1 WARNING, 2 CRITICAL or 3 UNKNOWN, with one line on stdout (Nagios conventions)
    ///
    /// CRITICAL: the last run failed, none started within --max-age (with --schedule: no run
    /// for the latest instant older than --max-age, default 5m), or it never ran. WARNING: a
    /// run has been going on for longer than --max-age. UNKNOWN: Redis unreachable or any
    /// other error.
    #[arg(long, requires = "key")]
    pub(super) check: bool,

    /// With --check: how old the last run may be (with --schedule: how long after an instant
    /// its run may take to start)
    #[arg(long, env = "CRONLOCK_MAX_AGE", value_name = "DURATION",
          value_parser = duration::positive, allow_hyphen_values = true)]
    pub max_age: Option<Span>,

    /// List every lock currently held, and every KEY suspended, under --prefix; then exit
    #[arg(long)]
    pub(super) list: bool,

    /// Delete KEY's lock whoever holds it (the holder's command is then stopped, exit 122)
    #[arg(long, requires = "key")]
    pub(super) force_release: bool,

    /// Suspend KEY across the fleet until --resume: every firing skips with the -E status (a
    /// running command goes on), and the instants that pass meanwhile are recorded skipped and
    /// never caught up; then exit
    #[arg(long, requires = "key")]
    pub(super) suspend: bool,

    /// With --suspend or --trigger: why, for whoever reads --status, --check or a skipped
    /// firing's -v line
    #[arg(
        long,
        env = "CRONLOCK_SUSPEND_REASON",
        value_name = "TEXT",
        requires = "asking"
    )]
    pub reason: Option<String>,

    /// With --suspend: end the suspension by itself after DURATION (on Redis's clock); the first
    /// instant after it runs. --resume still ends it early
    #[arg(long = "for", env = "CRONLOCK_SUSPEND_FOR", value_name = "DURATION",
          value_parser = duration::positive, allow_hyphen_values = true, requires = "suspend")]
    pub suspend_for: Option<Span>,

    /// End KEY's suspension: the next due instant runs; then exit
    #[arg(long, requires = "key")]
    pub(super) resume: bool,

    /// Ask the --crontab fleet serving KEY to run it once now, as a manual instant, under its own
    /// lock, suspension, --limit and --retries; exit 0 once a replica took it (with --wait: the
    /// command's status, 124 when the wait runs out), -E's status when it is skipped, 69 when
    /// no replica serving KEY took it within 10 s (within --wait, when shorter)
    #[arg(long, requires = "key")]
    pub(super) trigger: bool,

    /// With --force-release: release only the holder with this token (its CRONLOCK_TOKEN, shown
    /// by --status)
    #[arg(
        long,
        env = "CRONLOCK_RELEASE_TOKEN",
        value_name = "TOKEN",
        requires = "force_release"
    )]
    pub token: Option<String>,

    /// Print --status, --list, --force-release, --suspend, --resume and --next results as JSON
    #[arg(long, env = "CRONLOCK_JSON", value_parser = switch,
          default_value_t = false, num_args = 0, default_missing_value = "true")]
    pub json: bool,

    /// Run the jobs of this crontab as one of any number of equal replicas: each instant of each
    /// job runs once across them; a line is `SCHEDULE [OPTIONS] KEY COMMAND-LINE`
    ///
    /// SIGTERM or SIGINT: claim nothing more, let running jobs end within --drain, then stop them.
    /// SIGHUP, or a change of the file, reads it again. As cron demands, the file (after
    /// symlinks) must be owned by this user or root and writable by nobody else (chmod go-w):
    /// otherwise it is refused, at start and on reload.
    #[arg(long, env = "CRONLOCK_CRONTAB", value_name = "FILE",
          value_hint = clap::ValueHint::FilePath)]
    pub crontab: Option<std::path::PathBuf>,

    /// With --crontab: runs this replica supervises at once (and claims in flight); a due job
    /// waits for room here or on another replica, and is given up only when it can no longer
    /// start
    #[arg(long, env = "CRONLOCK_MAX_JOBS", value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1024), requires = "crontab")]
    pub max_jobs: u32,

    /// With --crontab: how long running jobs may go on after SIGTERM or SIGINT before they are
    /// stopped (SIGTERM, --grace, SIGKILL)
    #[arg(
        long,
        env = "CRONLOCK_DRAIN",
        value_name = "DURATION",
        default_value = "25s",
        allow_hyphen_values = true,
        requires = "crontab"
    )]
    pub drain: Span,

    /// With --crontab: serve /metrics (Prometheus), /healthz, /readyz and a status page at / on
    /// this address (HOST:PORT, or :PORT for every interface), read-only
    #[arg(long, env = "CRONLOCK_LISTEN", value_name = "ADDR", value_parser = listen_addr,
          requires = "crontab")]
    pub listen: Option<std::net::SocketAddr>,

    /// With --crontab: read and check FILE as a replica would (its owner, every line, every
    /// option against the others), print each job with its next instant, and exit: 0, or 125
    /// with FILE:LINE: message. Runs nothing and needs no Redis
    #[arg(long, env = "CRONLOCK_CRONTAB_TEST", value_parser = switch, default_value_t = false,
          num_args = 0, default_missing_value = "true", requires = "crontab")]
    pub test: bool,

    /// With --crontab and --listen: show on the status page the output each job's last failed
    /// run kept (--keep-output). Off by default: a job's output may hold secrets, and the page
    /// is read-only but not private
    #[arg(long, env = "CRONLOCK_SHOW_OUTPUT", value_parser = switch, default_value_t = false,
          num_args = 0, default_missing_value = "true", requires = "listen")]
    pub show_output: bool,

    /// Print the next instants of a cron schedule as cronlock runs them, in the schedule's time
    /// zone with UTC beside, daylight-saving changes marked; then exit
    ///
    /// The same expressions, time zones (CRON_TZ=Zone prefix) and daylight-saving rules as
    /// --schedule, by the same code. An expression with H needs --key (or KEY): H is drawn
    /// from it as the fleet draws it.
    #[arg(long, value_name = "CRON", value_parser = schedule)]
    pub next: Option<crate::fleet::schedule::Schedule>,

    /// With --next: how many instants to print
    #[arg(long, env = "CRONLOCK_NEXT_COUNT", value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=1000), requires = "next")]
    pub count: u32,

    /// With --next: the KEY whose H fields to draw (no variable: CRONLOCK_KEY is the command's)
    #[arg(long = "key", value_name = "KEY", requires = "next")]
    pub next_key: Option<String>,

    /// With --next: from this time on (instants at or after it): an RFC 3339 time
    /// (2026-03-29T00:00:00Z), or a date, or a date and time, in the schedule's time zone
    /// (2026-03-29, 2026-03-29 01:30) [default: now]
    #[arg(
        long,
        env = "CRONLOCK_NEXT_FROM",
        value_name = "TIME",
        requires = "next"
    )]
    pub from: Option<String>,

    /// Name of the lock; every host running the same job uses the same KEY (at most 1024 bytes).
    /// Every mode needs it but --list, --next and --crontab
    #[arg(value_name = "KEY", required_unless_present_any = Mode::flags().filter(|f| f.keyless).map(|f| f.id))]
    pub key: Option<String>,

    /// The command to run and its arguments, passed on untouched
    #[arg(value_name = "COMMAND", trailing_var_arg = true, value_hint = clap::ValueHint::CommandWithArguments)]
    pub command: Vec<OsString>,

    /// Where each value came from (command line, environment, default).
    #[arg(skip)]
    pub given: Given,

    /// What the command line asks for, decided while it is parsed (from the flag given).
    #[arg(skip)]
    pub mode: Mode,
}

/// What was given on the command line itself, as opposed to the environment or a default.
#[derive(Debug, Clone, Default)]
pub struct Given {
    pub redis_url: Option<ValueSource>,
    pub redis_url_file: Option<ValueSource>,
    pub ping_url_file: Option<ValueSource>,
    pub quiet: Option<ValueSource>,
    pub verbose: Option<ValueSource>,
    /// `--history` on the command line: with `--status`, show the kept runs.
    pub history_flag: bool,
}

/// A boolean flag or variable: `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off` (empty: off).
pub fn switch(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" | "y" => Ok(true),
        "" | "0" | "false" | "no" | "off" | "n" => Ok(false),
        _ => Err("expected 1, true, yes or on, or 0, false, no or off".into()),
    }
}

/// `--history [N]`: a count, or `all` when given bare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub Option<u32>);

/// The number of run records kept when `--history` is not given.
pub const DEFAULT_HISTORY: u32 = 10;

pub(super) fn history_count(s: &str) -> Result<Count, String> {
    if s == "all" {
        return Ok(Count(None));
    }
    s.trim()
        .parse::<u32>()
        .map(|n| Count(Some(n)))
        .map_err(|_| "expected a number of runs".into())
}

/// The longest `--catch-up` window: ten years.
pub const MAX_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(10 * 366 * 86_400);

/// The most `--retries`.
pub const MAX_RETRIES: u32 = 100;

/// `--catch-up DURATION`: from a second to ten years.
pub(super) fn catch_up(s: &str) -> Result<Span, String> {
    let span = duration::positive(s)?;
    if span.0 < std::time::Duration::from_secs(1) {
        return Err("the window must be at least 1s".into());
    }
    if span.0 > MAX_CATCH_UP {
        return Err("the window must be at most 10 years".into());
    }
    Ok(span)
}

/// `--retries N`: a count from 0 to [`MAX_RETRIES`].
pub(super) fn retries(s: &str) -> Result<u32, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n < 0 => Err("a count of retries cannot be negative".into()),
        Ok(n) if n > i64::from(MAX_RETRIES) => Err(format!("at most {MAX_RETRIES}")),
        Ok(n) => Ok(n as u32),
        Err(_) => Err("expected a count of retries (0, 1, 2, ...)".into()),
    }
}

pub use crate::log::LogFormat;

/// `--overlap`: one of [`Overlap::ALL`] by its word.
pub(super) fn overlap(text: &str) -> Result<crate::store::overlap::Overlap, String> {
    use crate::store::overlap::Overlap;
    Overlap::from_word(text.trim()).ok_or_else(|| {
        let words: Vec<&str> = Overlap::ALL.iter().map(|o| o.word()).collect();
        let (last, rest) = words.split_last().expect("policies");
        format!("expected {} or {last}", rest.join(", "))
    })
}

/// `--schedule`: a cron expression, checked now so a bad one is one line naming the field.
pub(super) fn schedule(text: &str) -> Result<crate::fleet::schedule::Schedule, String> {
    crate::fleet::schedule::Schedule::parse(text)
}

/// The most `--keep-output` keeps of one run.
pub const MAX_KEEP_OUTPUT: usize = 64 * 1024;

/// `--keep-output SIZE[,all]`: a size (bytes, K/KiB, M/MiB), and `all` to keep successes too.
fn keep_output(text: &str) -> Result<crate::config::KeepOutput, String> {
    let text = text.trim();
    let (size, all) = match text.split_once(',') {
        Some((size, "all")) => (size.trim(), true),
        Some(_) => return Err("expected SIZE or SIZE,all (e.g. 4KiB or 16KiB,all)".into()),
        None => (text, false),
    };
    let digits = size
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(size.len());
    let (number, unit) = size.split_at(digits);
    let scale: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => 1024 * 1024,
        _ => return Err("expected a size: bytes, or with K/KiB or M/MiB (e.g. 4KiB)".into()),
    };
    let bytes = number
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or("expected a size: bytes, or with K/KiB or M/MiB (e.g. 4KiB)")?;
    if bytes > MAX_KEEP_OUTPUT {
        return Err("at most 64KiB: the output is kept in Redis with every run's record".into());
    }
    Ok(crate::config::KeepOutput {
        bytes,
        successes: all,
    })
}

/// `--listen`: `HOST:PORT` (a name is looked up once), or `:PORT` for every interface.
fn listen_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_string(),
    };
    full.to_socket_addrs()
        .ok()
        .and_then(|mut all| all.next())
        .ok_or_else(|| {
            "not an address to listen on: give HOST:PORT or :PORT (e.g. 127.0.0.1:9746)".to_string()
        })
}
