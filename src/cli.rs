//! The command line: one clap definition that is also the source of `--help`, the man page and the
//! shell completions, plus the checks clap cannot express (one of COMMAND or `-c`, KEY non-empty).

use std::ffi::OsString;

use anyhow::{bail, Result};
use clap::builder::FalseyValueParser;
use clap::{ArgGroup, CommandFactory, Parser, ValueEnum};

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
        "the command was terminated because the lock was lost",
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
];

/// Examples for `--help` and the man page: (what it does, the command line).
pub const EXAMPLES: &[(&str, &str)] = &[
    (
        "crontab on every host: the report runs once per night across the fleet",
        "0 2 * * * cronlock nightly-report -- /usr/local/bin/report.sh",
    ),
    (
        "a shell command line, run through /bin/sh -c",
        "cronlock -u redis://:secret@redis.internal:6379/2 backup -c 'pg_dump app | gzip > /backup/app.gz'",
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
/// outcome). Every option can also be set from the environment variable shown.
#[derive(Debug, Parser)]
#[command(
    name = "cronlock",
    version,
    after_long_help = after_long_help(),
    override_usage = "cronlock [OPTIONS] <KEY> [--] <COMMAND> [ARGS]...\n       \
                      cronlock [OPTIONS] <KEY> -c <SHELL_COMMAND>\n       \
                      cronlock --status [--json] <KEY>\n       \
                      cronlock --list [--json]\n       \
                      cronlock --force-release <KEY>",
    group(ArgGroup::new("admin").args(["status", "list", "force_release"]))
)]
pub struct Cli {
    /// Redis server URL: redis://[user][:password@]host[:port][/db] or redis+unix:///path
    ///
    /// Falls back to REDIS_URL, then to redis://127.0.0.1:6379.
    // The value may hold a password: --help must not show it.
    #[arg(
        short = 'u',
        long,
        env = "CRONLOCK_REDIS_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub redis_url: Option<String>,

    /// Lock expiry in Redis; it only matters when the holder dies
    #[arg(short, long, env = "CRONLOCK_TTL", value_name = "DURATION", default_value = "30s",
          value_parser = duration::positive)]
    pub ttl: Span,

    /// How long to wait for a busy lock before giving up (0: do not wait)
    #[arg(
        short,
        long,
        env = "CRONLOCK_WAIT",
        value_name = "DURATION",
        default_value = "0"
    )]
    pub wait: Span,

    /// Do not wait for a busy lock, like flock -n (same as --wait 0)
    #[arg(short, long, env = "CRONLOCK_NONBLOCK", value_parser = FalseyValueParser::new(),
          default_value_t = false, num_args = 0, default_missing_value = "true")]
    pub nonblock: bool,

    /// Time between SIGTERM and SIGKILL when cronlock stops the command [default: 5s, at most
    /// a quarter of --ttl]
    ///
    /// An explicit value must be at most half of --ttl: the command must be gone before the lock
    /// can expire.
    #[arg(long, env = "CRONLOCK_GRACE", value_name = "DURATION")]
    pub grace: Option<Span>,

    /// Stop the command (SIGTERM, then SIGKILL after --grace) when it runs longer; exit 124
    #[arg(long, env = "CRONLOCK_MAX_RUNTIME", value_name = "DURATION",
          value_parser = duration::positive)]
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
        default_value = "0"
    )]
    pub min_hold: Span,

    /// Exit status when the lock is held elsewhere and the command does not run
    #[arg(
        short = 'E',
        long,
        env = "CRONLOCK_CONFLICT_EXIT_CODE",
        value_name = "N",
        default_value_t = 0
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
    #[arg(short, long, env = "CRONLOCK_QUIET", value_parser = FalseyValueParser::new(),
          default_value_t = false, num_args = 0, default_missing_value = "true",
          conflicts_with = "verbose")]
    pub quiet: bool,

    /// Also report a busy lock, acquisition, release and renewals
    #[arg(short, long, env = "CRONLOCK_VERBOSE", value_parser = FalseyValueParser::new(),
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
          value_parser = duration::positive)]
    pub connect_timeout: Span,

    /// How many past run records to keep per KEY (0: only the last run)
    #[arg(long, env = "CRONLOCK_HISTORY", value_name = "N", default_value_t = 10)]
    pub history: u32,

    /// Expire the last-run record and history this long after the last run [default: never]
    #[arg(long, env = "CRONLOCK_HISTORY_TTL", value_name = "DURATION",
          value_parser = duration::positive)]
    pub history_ttl: Option<Span>,

    /// Format of cronlock's own messages on stderr
    #[arg(long, env = "CRONLOCK_LOG_FORMAT", value_name = "FORMAT", value_enum,
          default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Show whether KEY is held, by whom, and its last run; then exit
    #[arg(long, requires = "key")]
    pub status: bool,

    /// List every lock currently held under --prefix; then exit
    #[arg(long)]
    pub list: bool,

    /// Delete KEY's lock whoever holds it (the holder's command is then stopped, exit 122)
    #[arg(long, requires = "key")]
    pub force_release: bool,

    /// Print --status, --list and --force-release results as JSON
    #[arg(long, env = "CRONLOCK_JSON", value_parser = FalseyValueParser::new(),
          default_value_t = false, num_args = 0, default_missing_value = "true")]
    pub json: bool,

    /// Name of the lock; every host running the same job uses the same KEY
    #[arg(value_name = "KEY")]
    pub key: Option<String>,

    /// The command to run and its arguments, passed on untouched
    #[arg(value_name = "COMMAND", trailing_var_arg = true)]
    pub command: Vec<OsString>,
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
    /// The Redis URL after the documented fallbacks.
    pub fn redis_url(&self) -> String {
        self.redis_url
            .clone()
            .filter(|u| !u.is_empty())
            .or_else(|| std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()))
            .unwrap_or_else(|| DEFAULT_REDIS_URL.to_string())
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
        let admin = if self.status {
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
            Some(k) => k.to_string(),
        };
        Ok(if self.status {
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
            Some(k) => k.to_string(),
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
        Ok(Job { key, argv })
    }
}

/// Parse `std::env::args_os()`; see [`one_line`] for how errors are shown.
pub fn parse() -> std::result::Result<Cli, clap::Error> {
    Cli::try_parse()
}

/// clap's error as one `cronlock:`-style line.
pub fn one_line(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    // The message is the first paragraph (some span lines: "required arguments: <KEY>").
    let message: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    format!("{message} (see 'cronlock --help')")
}

/// The clap command, for the man page and completion generators.
pub fn command() -> clap::Command {
    Cli::command()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_cli() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("cronlock").chain(args.iter().copied())).unwrap()
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
