//! The command line: one clap definition that is also the source of `--help`, the man page and the
//! shell completions, plus the checks clap cannot express (one of COMMAND or `-c`, KEY non-empty).

use std::ffi::OsString;

use anyhow::{bail, Result};
use clap::parser::ValueSource;
use clap::{ArgGroup, ArgMatches, CommandFactory, FromArgMatches, Parser, ValueEnum};

use crate::duration::{self, Span};

/// The default Redis URL when neither `--redis-url`, `CRONLOCK_REDIS_URL` nor `REDIS_URL` is set.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// The exit-status table: one source for `--help`, the man page and the tests.
pub const EXIT_STATUS: &[(&str, &str)] = &[
    ("the child's own", "the command ran and exited"),
    ("128+N", "the command was killed by signal N"),
    (
        "-E (default 0)",
        "the lock is held elsewhere (or --wait ran out); the command did not run",
    ),
    (
        "122",
        "the lock was lost: the command was terminated (or not started, when the lock was granted \
         too late to be safe)",
    ),
    (
        "124",
        "the command was terminated because it ran past --max-runtime",
    ),
    (
        "125",
        "cronlock itself failed (bad usage or value, Redis unreachable, authentication refused, \
         unexpected reply); the command did not run",
    ),
    ("126", "the command was found but could not be executed"),
    ("127", "the command was not found"),
    (
        "0, 1, 2, 3",
        "with --check: OK, WARNING, CRITICAL, UNKNOWN (monitoring plugin conventions; never 125)",
    ),
];

/// Examples for `--help` and the man page: (what it does, the command line).
pub const EXAMPLES: &[(&str, &str)] = &[
    (
        "crontab on every host: the report runs once per night across the fleet",
        "0 2 * * * cronlock nightly-report -- /usr/local/bin/report.sh",
    ),
    (
        "a shell command line, run through /bin/sh -c; the password comes from the environment, not -u",
        "CRONLOCK_REDIS_URL=redis://:secret@redis.internal:6379/2 cronlock backup -c 'pg_dump app | gzip > /backup/app.gz'",
    ),
    (
        "wait up to 5 minutes for the lock; tell a skip (75) from a run in a script",
        "cronlock -w 5m -E 75 migrate -- ./migrate.sh",
    ),
];

/// What the child finds in its environment.
pub const CHILD_ENV: &str =
    "The command gets CRONLOCK_KEY, CRONLOCK_TOKEN and CRONLOCK_FENCING_TOKEN in its environment.";

fn after_long_help() -> String {
    let mut s = String::from("Examples:\n");
    for (what, cmd) in EXAMPLES {
        s += &format!("  # {what}\n  {cmd}\n\n");
    }
    s += "Exit status:\n";
    for (code, meaning) in EXIT_STATUS {
        // Wrap by hand so continuation lines stay in the meaning column.
        let mut line = format!("  {code:<16}");
        for word in meaning.split(' ') {
            if line.len() + word.len() > 90 {
                s += &line;
                s += "\n";
                line = " ".repeat(18);
            }
            line += " ";
            line += word;
        }
        s += &line;
        s += "\n";
    }
    s += "\n";
    s += CHILD_ENV;
    s
}

/// Run a command under a cluster-wide lock held in Redis.
///
/// cronlock takes the lock KEY atomically, runs COMMAND while holding it, releases it, and exits with
/// the command's status. When the lock is held elsewhere the command does not run and cronlock exits
/// with the -E status (0 by default, since on a fleet "another host runs this slot" is the normal
/// outcome). Every option except -c and the modes --status, --list and --force-release can also be
/// set from the environment variable shown; an option on the command line wins over its variable.
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
                      cronlock --force-release <KEY>",
    group(ArgGroup::new("admin").args(["status", "check", "list", "force_release"]))
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
    /// Docker or Kubernetes secret mounted as a file
    #[arg(long, env = "CRONLOCK_REDIS_URL_FILE", value_name = "PATH",
          value_hint = clap::ValueHint::FilePath, conflicts_with = "redis_url")]
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
    /// gets CRONLOCK_SLOT (0..N-1). Every host must give the same N
    #[arg(long, env = "CRONLOCK_LIMIT", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=crate::store::lock::MAX_LIMIT as i64))]
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

    /// Exit status when the lock is held elsewhere and the command does not run
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
    /// no command line or environment
    #[arg(long, env = "CRONLOCK_PING_URL_FILE", value_name = "PATH",
          value_hint = clap::ValueHint::FilePath, conflicts_with = "ping_url")]
    pub ping_url_file: Option<std::path::PathBuf>,

    /// With --ping: send the last 10 KiB of the command's output (stdout and stderr) as the
    /// final ping's body; the output then passes through cronlock on its way to yours
    #[arg(long, env = "CRONLOCK_PING_BODY", value_parser = switch,
          default_value_t = false, num_args = 0, default_missing_value = "true")]
    pub ping_body: bool,

    /// Format of cronlock's own messages on stderr
    #[arg(long, env = "CRONLOCK_LOG_FORMAT", value_name = "FORMAT", value_enum,
          default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Show whether KEY is held, by whom, and its last run; then exit
    #[arg(long, requires = "key")]
    pub status: bool,

    /// Monitoring plugin: judge KEY's last run from its record in Redis and exit 0 OK,
    /// 1 WARNING, 2 CRITICAL or 3 UNKNOWN, with one line on stdout (Nagios conventions)
    ///
    /// CRITICAL: the last run failed, none started within --max-age (with --schedule: no run
    /// for the latest instant older than --max-age, default 5m), or it never ran. WARNING: a
    /// run has been going on for longer than --max-age. UNKNOWN: Redis unreachable or any
    /// other error.
    #[arg(long, requires = "key")]
    pub check: bool,

    /// With --check: how old the last run may be (with --schedule: how long after an instant
    /// its run may take to start)
    #[arg(long, env = "CRONLOCK_MAX_AGE", value_name = "DURATION",
          value_parser = duration::positive, allow_hyphen_values = true)]
    pub max_age: Option<Span>,

    /// List every lock currently held under --prefix; then exit
    #[arg(long)]
    pub list: bool,

    /// Delete KEY's lock whoever holds it (the holder's command is then stopped, exit 122)
    #[arg(long, requires = "key")]
    pub force_release: bool,

    /// With --force-release: release only the holder with this token (its CRONLOCK_TOKEN, shown
    /// by --status)
    #[arg(
        long,
        env = "CRONLOCK_RELEASE_TOKEN",
        value_name = "TOKEN",
        requires = "force_release"
    )]
    pub token: Option<String>,

    /// Print --status, --list and --force-release results as JSON
    #[arg(long, env = "CRONLOCK_JSON", value_parser = switch,
          default_value_t = false, num_args = 0, default_missing_value = "true")]
    pub json: bool,

    /// Name of the lock; every host running the same job uses the same KEY (at most 1024 bytes)
    #[arg(value_name = "KEY")]
    pub key: Option<String>,

    /// The command to run and its arguments, passed on untouched
    #[arg(value_name = "COMMAND", trailing_var_arg = true, value_hint = clap::ValueHint::CommandWithArguments)]
    pub command: Vec<OsString>,

    /// Where each value came from (command line, environment, default).
    #[arg(skip)]
    pub given: Given,
}

/// What was given on the command line itself, as opposed to the environment or a default.
#[derive(Debug, Clone, Default)]
pub struct Given {
    pub redis_url: Option<ValueSource>,
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

fn history_count(s: &str) -> Result<Count, String> {
    if s == "all" {
        return Ok(Count(None));
    }
    s.trim()
        .parse::<u32>()
        .map(|n| Count(Some(n)))
        .map_err(|_| "expected a number of runs".into())
}

/// `--log-format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `cronlock: ...` lines
    Text,
    /// one JSON object per line
    Json,
}

/// What cronlock was asked to do.
#[derive(Debug, Clone)]
pub enum Mode {
    Run(Job),
    Status(String),
    Check(String),
    List,
    ForceRelease(String),
}

/// What to run, once the arguments are checked.
#[derive(Debug, Clone)]
pub struct Job {
    pub key: String,
    /// argv of the child: `[COMMAND, ARGS...]` or `["/bin/sh", "-c", SHELL_COMMAND]`.
    pub argv: Vec<OsString>,
}

impl Cli {
    /// `-q` and `-v` after the environment: a variable set to off is off, and a flag on the
    /// command line wins over a variable.
    pub fn quiet_verbose(&self) -> Result<(bool, bool)> {
        if !(self.quiet && self.verbose) {
            return Ok((self.quiet, self.verbose));
        }
        let cmdline = |s: Option<ValueSource>| s == Some(ValueSource::CommandLine);
        match (cmdline(self.given.quiet), cmdline(self.given.verbose)) {
            (true, true) => bail!("give either -q/--quiet or -v/--verbose, not both"),
            (true, false) => Ok((true, false)),
            (false, true) => Ok((false, true)),
            (false, false) => {
                bail!("CRONLOCK_QUIET and CRONLOCK_VERBOSE are both on: turn one of them off")
            }
        }
    }

    /// How many run records to keep (`--history N`).
    pub fn history_kept(&self) -> Result<u32> {
        match self.history {
            None => Ok(DEFAULT_HISTORY),
            Some(Count(Some(n))) => Ok(n),
            Some(Count(None)) => bail!("--history needs a number N of runs to keep"),
        }
    }

    /// The TLS options, checked together.
    pub fn tls(&self) -> Result<crate::store::tls::TlsOptions> {
        let tls = crate::store::tls::TlsOptions {
            ca_cert: self.tls_ca_cert.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        };
        tls.check()?;
        Ok(tls)
    }

    /// `--max-runtime`, where 0 means no limit.
    pub fn max_runtime(&self) -> Option<std::time::Duration> {
        self.max_runtime.map(|m| m.0).filter(|m| !m.is_zero())
    }

    /// The Redis URLs after the documented fallbacks (a value may hold several, separated by
    /// whitespace), and where they came from (for messages).
    pub fn redis_urls(&self) -> Result<(Vec<String>, &'static str)> {
        let (urls, source): (Vec<String>, &'static str) = if let Some(path) = &self.redis_url_file {
            let source = source_of("--redis-url-file", "CRONLOCK_REDIS_URL_FILE");
            let text = read_secret(path, source)?;
            (
                text.split_whitespace().map(str::to_string).collect(),
                source,
            )
        } else {
            let urls: Vec<String> = self
                .redis_url
                .iter()
                .flat_map(|u| u.split_whitespace())
                .map(str::to_string)
                .collect();
            if !urls.is_empty() {
                let source = if self.given.redis_url == Some(ValueSource::EnvVariable) {
                    "CRONLOCK_REDIS_URL"
                } else {
                    "--redis-url"
                };
                (urls, source)
            } else {
                match std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()) {
                    Some(url) => (vec![url], "REDIS_URL"),
                    None => (vec![DEFAULT_REDIS_URL.to_string()], "--redis-url"),
                }
            }
        };
        for (i, url) in urls.iter().enumerate() {
            if urls[..i].contains(url) {
                bail!(
                    "{source} names '{}' twice: each master of a quorum must be a different server",
                    crate::store::connect::redact_url(url)
                );
            }
        }
        Ok((urls, source))
    }

    /// The `--ping` URL, from the flag, its variable or `--ping-url-file`.
    pub fn ping(&self) -> Result<Option<String>> {
        match &self.ping_url_file {
            Some(path) => {
                let source = source_of("--ping-url-file", "CRONLOCK_PING_URL_FILE");
                read_secret(path, source).map(Some)
            }
            None => Ok(self.ping_url.clone()),
        }
    }

    /// The wait actually used: `-n` wins over `-w`.
    pub fn wait(&self) -> std::time::Duration {
        if self.nonblock {
            std::time::Duration::ZERO
        } else {
            self.wait.0
        }
    }

    /// The mode, with the checks clap cannot express.
    pub fn mode(&self) -> Result<Mode> {
        let admin = if self.check {
            Some("--check")
        } else if self.status {
            Some("--status")
        } else if self.list {
            Some("--list")
        } else if self.force_release {
            Some("--force-release")
        } else {
            None
        };
        let Some(flag) = admin else {
            return self.job().map(Mode::Run);
        };
        if !self.command.is_empty() || self.shell_command.is_some() {
            bail!("{flag} runs no command: remove COMMAND");
        }
        if self.list {
            if self.key.is_some() {
                bail!("--list takes no KEY");
            }
            return Ok(Mode::List);
        }
        let key = match self.key.as_deref() {
            None | Some("") => bail!("{flag} needs a non-empty KEY"),
            Some(k) => check_key(k)?,
        };
        Ok(if self.check {
            Mode::Check(key)
        } else if self.status {
            Mode::Status(key)
        } else {
            Mode::ForceRelease(key)
        })
    }

    /// Checks that clap cannot express, each with a message naming what is wrong.
    pub fn job(&self) -> Result<Job> {
        let key = match self.key.as_deref() {
            None => bail!("missing KEY: usage: cronlock [OPTIONS] <KEY> [--] <COMMAND> [ARGS]..."),
            Some("") => bail!("KEY must not be empty"),
            Some(k) => check_key(k)?,
        };
        let argv = match (&self.shell_command, self.command.is_empty()) {
            (Some(_), false) => {
                bail!("give either COMMAND or -c SHELL_COMMAND, not both")
            }
            (None, true) => bail!("missing COMMAND: give a command after KEY or use -c"),
            (Some(sh), true) => vec!["/bin/sh".into(), "-c".into(), sh.into()],
            (None, false) => self.command.clone(),
        };
        if argv[0].is_empty() {
            bail!("COMMAND must not be empty");
        }
        if self.limit > 1 && self.schedule.is_some() {
            bail!(
                "--schedule runs the job once per instant, so it takes no --limit above 1 (got \
                 --limit {})",
                self.limit
            );
        }
        Ok(Job { key, argv })
    }
}

/// The flag or the variable, as the user gave a file option: for messages.
fn source_of(flag: &'static str, var: &'static str) -> &'static str {
    let on_cmdline = std::env::args_os()
        .skip(1)
        .any(|a| a.to_string_lossy().split('=').next() == Some(flag));
    if on_cmdline || std::env::var_os(var).is_none() {
        flag
    } else {
        var
    }
}

/// A secret read from a file: trimmed, never shown. A missing, unreadable or empty file is an
/// error naming `source` (the option or variable) and the path, not the content.
fn read_secret(path: &std::path::Path, source: &str) -> Result<String> {
    let text = std::fs::read(path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read {source} '{}': {}",
            path.display(),
            crate::log::io_text(&e)
        )
    })?;
    let text = String::from_utf8(text)
        .map_err(|_| anyhow::anyhow!("{source} '{}' is not UTF-8 text", path.display()))?;
    let text = text.trim();
    if text.is_empty() {
        bail!("{source} '{}' is empty", path.display());
    }
    Ok(text.to_string())
}

/// The longest KEY, in bytes: a name, not data. It leaves ample room in `execve` for the command's
/// `CRONLOCK_KEY` (one string may have 128 KiB) and in a metrics file name.
pub const MAX_KEY: usize = 1024;

/// A variable of ours whose value is not UTF-8: clap would only say "invalid UTF-8 ... in one or
/// more arguments", without naming it.
fn non_utf8_variable() -> Option<String> {
    std::env::vars_os()
        .filter(|(_, v)| v.to_str().is_none())
        .filter_map(|(k, _)| k.into_string().ok())
        .find(|k| k.starts_with("CRONLOCK_") || k == "REDIS_URL")
}

/// KEY within [`MAX_KEY`].
fn check_key(key: &str) -> Result<String> {
    if key.len() > MAX_KEY {
        bail!(
            "KEY is {} bytes long; it may have at most {MAX_KEY}",
            key.len()
        );
    }
    Ok(key.to_string())
}

/// Parse `std::env::args_os()`; see [`one_line`] for how errors are shown.
pub fn parse() -> std::result::Result<Cli, clap::Error> {
    if let Some(var) = non_utf8_variable() {
        return Err(clap::Error::raw(
            clap::error::ErrorKind::InvalidUtf8,
            format!("{var} is not valid UTF-8\n"),
        ));
    }
    if let Some(cli) = common_case(std::env::args_os().skip(1), std::env::vars_os()) {
        return Ok(cli);
    }
    let matches = Cli::command().try_get_matches_from(history_flag_apart(std::env::args_os()))?;
    from_matches(&matches)
}

/// `--history` takes an optional count, so `--status --history KEY` would read KEY as the count:
/// in the modes that run no command (`--status`, `--check`, `--list`, `--force-release`), a
/// `--history` whose next word is not a count (a number or `all`) stands alone, as
/// `--history=all`. (`--history=N` is the form that cannot be misread.) A run's COMMAND and its
/// arguments are never touched.
fn history_flag_apart(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.collect();
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let admin = args[..end].iter().any(|a| {
        ["--status", "--check", "--list", "--force-release"].contains(&a.to_str().unwrap_or(""))
    });
    if !admin {
        return args;
    }
    for i in 1..end {
        let next_is_count = args
            .get(i + 1)
            .and_then(|a| a.to_str())
            .is_some_and(|a| history_count(a).is_ok());
        if args[i] == "--history" && !next_is_count {
            args[i] = "--history=all".into();
        }
    }
    args
}

/// The way cronlock is run on every tick of every host, `cronlock KEY [--] COMMAND [ARGS...]`
/// with settings from a few variables, parsed without clap: building clap's command definition
/// costs about a quarter of a millisecond per run, a tenth of the whole run. It accepts only what
/// is unambiguous and known to mean the same to clap (same value parsers, same defaults; the test
/// `the_common_case_parses_as_clap_does` compares the two), and returns `None` for anything
/// else: any option, any other `CRONLOCK_*` variable, a value that does not parse (clap then
/// says what is wrong). A new field of [`Cli`] does not compile here until it has its default.
fn common_case(
    args: impl Iterator<Item = OsString>,
    vars: impl Iterator<Item = (OsString, OsString)>,
) -> Option<Cli> {
    let mut args = args.peekable();
    let key = args.next()?.into_string().ok()?;
    if key.is_empty() || key.starts_with('-') {
        return None;
    }
    if args.peek()? == "--" {
        args.next();
    } else if args.peek()?.as_encoded_bytes().starts_with(b"-") {
        return None;
    }
    let command: Vec<OsString> = args.collect();
    if command.is_empty() {
        return None;
    }
    let mut cli = Cli {
        redis_url: Vec::new(),
        redis_url_file: None,
        tls_ca_cert: None,
        tls_cert: None,
        tls_key: None,
        ttl: duration::positive("30s").ok()?,
        wait: "0".parse().ok()?,
        nonblock: false,
        grace: None,
        max_runtime: None,
        min_hold: "0".parse().ok()?,
        limit: 1,
        schedule: None,
        conflict_exit_code: 0,
        shell_command: None,
        quiet: false,
        verbose: false,
        prefix: "cronlock:".into(),
        connect_timeout: duration::positive("5s").ok()?,
        min_replicas: 0,
        history: None,
        history_ttl: None,
        metrics_dir: None,
        ping_url: None,
        ping_url_file: None,
        ping_body: false,
        log_format: LogFormat::Text,
        status: false,
        check: false,
        max_age: None,
        list: false,
        force_release: false,
        token: None,
        json: false,
        key: Some(key),
        command,
        given: Given {
            redis_url: None,
            quiet: Some(ValueSource::DefaultValue),
            verbose: Some(ValueSource::DefaultValue),
            history_flag: false,
        },
    };
    for (name, value) in vars {
        let Some(name) = name.to_str().filter(|n| n.starts_with("CRONLOCK_")) else {
            continue;
        };
        let value = value.into_string().ok().filter(|v| !v.is_empty())?;
        match name {
            "CRONLOCK_REDIS_URL" => {
                cli.redis_url = vec![value];
                cli.given.redis_url = Some(ValueSource::EnvVariable);
            }
            "CRONLOCK_TTL" => cli.ttl = duration::positive(&value).ok()?,
            "CRONLOCK_CONFLICT_EXIT_CODE" if value.bytes().all(|b| b.is_ascii_digit()) => {
                cli.conflict_exit_code = value.parse().ok()?;
            }
            "CRONLOCK_CONNECT_TIMEOUT" => {
                cli.connect_timeout = duration::positive(&value).ok()?;
            }
            "CRONLOCK_PREFIX" => cli.prefix = value,
            "CRONLOCK_LOG_FORMAT" => cli.log_format = LogFormat::from_str(&value, false).ok()?,
            _ => return None,
        }
    }
    Some(cli)
}

fn from_matches(matches: &ArgMatches) -> std::result::Result<Cli, clap::Error> {
    let mut cli = Cli::from_arg_matches(matches)?;
    cli.given = Given {
        redis_url: matches.value_source("redis_url"),
        quiet: matches.value_source("quiet"),
        verbose: matches.value_source("verbose"),
        history_flag: matches.value_source("history") == Some(ValueSource::CommandLine),
    };
    Ok(cli)
}

/// The variable an invalid value came from, when it did not come from the command line.
fn invalid_from_env(err: &clap::Error) -> Option<(String, String)> {
    use clap::error::{ContextKind, ContextValue};
    let ContextValue::String(arg) = err.get(ContextKind::InvalidArg)? else {
        return None;
    };
    let ContextValue::String(value) = err.get(ContextKind::InvalidValue)? else {
        return None;
    };
    let long = arg
        .split([' ', '='])
        .next()?
        .strip_prefix("--")?
        .to_string();
    let cmd = Cli::command();
    let def = cmd.get_arguments().find(|a| a.get_long() == Some(&long))?;
    let var = def.get_env()?.to_string_lossy().into_owned();
    let on_cmdline = std::env::args_os().skip(1).any(|a| {
        let a = a.to_string_lossy();
        a == format!("--{long}")
            || a.starts_with(&format!("--{long}="))
            || def
                .get_short()
                .is_some_and(|c| a.starts_with('-') && !a.starts_with("--") && a.contains(c))
    });
    let from_env = std::env::var(&var).is_ok_and(|v| &v == value);
    (from_env && !on_cmdline).then(|| (format!("--{long}"), var))
}

/// clap's error as one `cronlock:`-style line, naming the variable when a value came from one.
pub fn one_line(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    // The message is the first paragraph (some span lines: "required arguments: <KEY>").
    let message: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let message = message.join(" ");
    let mut message = message
        .strip_prefix("error: ")
        .unwrap_or(&message)
        .to_string();
    // "for '--ttl <DURATION>'" reads better as "for --ttl".
    if let (Some(start), Some(quote)) = (message.find(" for '--"), message.find("': ")) {
        if quote > start {
            let flag = message[start + 6..quote]
                .split(' ')
                .next()
                .unwrap_or_default()
                .to_string();
            let named = match invalid_from_env(err) {
                Some((_, var)) => format!(" for {flag} (from {var})"),
                None => format!(" for {flag}"),
            };
            message.replace_range(start..quote + 1, &named);
        }
    }
    format!("{message} (see 'cronlock --help')")
}

/// The clap command, for the man page and completion generators.
pub fn command() -> clap::Command {
    Cli::command()
}

/// `--schedule`: a cron expression, checked now so a bad one is one line naming the field.
fn schedule(text: &str) -> Result<crate::fleet::schedule::Schedule, String> {
    crate::fleet::schedule::Schedule::parse(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_cli() {
        Cli::command().debug_assert();
    }

    /// What [`common_case`] gives for `args` (with this process's environment) must be what
    /// clap gives, whenever it gives anything. Run by the test below in a child process, since
    /// clap reads its variables from the process environment.
    #[test]
    fn common_case_in_this_process() {
        let Some(args) = std::env::var_os("CLI_TEST_ARGS") else {
            return;
        };
        let args: Vec<OsString> = args
            .to_str()
            .unwrap()
            .split('\u{1f}')
            .map(OsString::from)
            .collect();
        let vars = || std::env::vars_os().filter(|(k, _)| k != "CLI_TEST_ARGS");
        let fast = common_case(args.clone().into_iter(), vars());
        let expected = std::env::var("CLI_TEST_COMMON").unwrap() == "yes";
        assert_eq!(fast.is_some(), expected, "common case for {args:?}");
        if let Some(fast) = fast {
            let argv = std::iter::once(OsString::from("cronlock")).chain(args);
            let matches = Cli::command().try_get_matches_from(argv).unwrap();
            let clap = from_matches(&matches).unwrap();
            assert_eq!(format!("{fast:?}"), format!("{clap:?}"));
        }
    }

    #[test]
    fn the_common_case_parses_as_clap_does() {
        type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], bool);
        let cases: &[Case] = &[
            (&["k", "--", "true"], &[], true),
            (&["k", "true"], &[], true),
            (&["k", "sh", "-c", "exit 3"], &[], true),
            (&["k", "--", "ls", "-la", "--", "x"], &[], true),
            (&["nightly report", "--", "/bin/echo", "a b", ""], &[], true),
            (&["k", "--", "-x"], &[], true),
            (&["k", "-c", "true"], &[], false),
            (&["-E", "99", "k", "--", "true"], &[], false),
            (&["k", "--ttl", "5s", "--", "true"], &[], false),
            (&["k"], &[], false),
            (&["k", "--"], &[], false),
            (&["--", "k", "true"], &[], false),
            (&["", "--", "true"], &[], false),
            (
                &["k", "--", "true"],
                &[
                    ("CRONLOCK_REDIS_URL", "redis://a:1 redis://b:2"),
                    ("CRONLOCK_TTL", "10m"),
                    ("CRONLOCK_CONFLICT_EXIT_CODE", "99"),
                    ("CRONLOCK_CONNECT_TIMEOUT", "1.5"),
                    ("CRONLOCK_PREFIX", "jobs:"),
                    ("CRONLOCK_LOG_FORMAT", "json"),
                ],
                true,
            ),
            (&["k", "true"], &[("CRONLOCK_TTL", "0")], false),
            (
                &["k", "true"],
                &[("CRONLOCK_CONFLICT_EXIT_CODE", "300")],
                false,
            ),
            (
                &["k", "true"],
                &[("CRONLOCK_CONFLICT_EXIT_CODE", "+3")],
                false,
            ),
            (&["k", "true"], &[("CRONLOCK_LOG_FORMAT", "yaml")], false),
            (&["k", "true"], &[("CRONLOCK_REDIS_URL", "")], false),
            (&["k", "true"], &[("CRONLOCK_VERBOSE", "1")], false),
            (&["k", "true"], &[("CRONLOCK_KEY", "outer")], false),
            (&["k", "true"], &[("PATH", "/bin"), ("HOME", "/")], true),
        ];
        let exe = std::env::current_exe().unwrap();
        for (args, vars, common) in cases {
            let out = std::process::Command::new(&exe)
                .args(["--exact", "cli::tests::common_case_in_this_process"])
                .args(["--nocapture", "--test-threads=1"])
                .env_clear()
                .env("CLI_TEST_ARGS", args.join("\u{1f}"))
                .env("CLI_TEST_COMMON", if *common { "yes" } else { "no" })
                .envs(vars.iter().copied())
                .output()
                .unwrap();
            assert!(
                out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
                "{args:?} {vars:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    fn parse(args: &[&str]) -> Cli {
        let m = Cli::command()
            .try_get_matches_from(std::iter::once("cronlock").chain(args.iter().copied()))
            .unwrap();
        from_matches(&m).unwrap()
    }

    #[test]
    fn switches() {
        for on in ["1", "true", "YES", "on"] {
            assert_eq!(switch(on), Ok(true));
        }
        for off in ["", "0", "false", "No", "off"] {
            assert_eq!(switch(off), Ok(false));
        }
        assert!(switch("maybe").is_err());
        assert!(switch("2").is_err());
    }

    #[test]
    fn history_flag() {
        let cli = parse(&["--status", "k", "--history"]);
        assert!(cli.given.history_flag);
        assert_eq!(cli.history, Some(Count(None)));
        assert_eq!(
            parse(&["--history", "3", "k", "true"])
                .history_kept()
                .unwrap(),
            3
        );
        assert_eq!(
            parse(&["k", "true"]).history_kept().unwrap(),
            DEFAULT_HISTORY
        );
    }

    #[test]
    fn hyphenated_arguments_go_to_the_child() {
        let cli = parse(&["k", "ls", "-la", "--color"]);
        assert_eq!(cli.job().unwrap().argv, vec!["ls", "-la", "--color"]);
        let cli = parse(&["-v", "k", "--", "ls", "-v"]);
        assert!(cli.verbose);
        assert_eq!(cli.job().unwrap().argv, vec!["ls", "-v"]);
    }

    #[test]
    fn shell_command() {
        let cli = parse(&["k", "-c", "echo hi"]);
        assert_eq!(cli.job().unwrap().argv, vec!["/bin/sh", "-c", "echo hi"]);
        assert!(parse(&["k", "-c", "x", "ls"]).job().is_err());
        assert!(parse(&["k"]).job().is_err());
        assert!(parse(&["", "true"]).job().is_err());
    }
}
