//! The command line: the clap definition ([`args`]: the source of `--help`, the man page and the
//! shell completions), the clap-free common case ([`common`]), and the checks clap cannot express
//! (one of COMMAND or `-c`, KEY non-empty and short, secrets read from files).

use std::ffi::OsString;

use crate::log::Verbosity;
use anyhow::{bail, Result};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};

pub mod args;
pub mod common;
pub(crate) mod crontab;
pub mod help;
mod message;
pub mod mode;
pub mod request;
mod resolve;

pub use args::*;
use common::common_case;
pub use help::{CHILD_ENV, EXAMPLES, EXIT_STATUS};
pub use message::one_line;
pub use mode::{Mode, ModeFlag};

/// What a run is for, once the arguments are checked: its KEY and its command.
#[derive(Debug, Clone)]
pub(crate) struct RunTarget {
    pub key: String,
    /// argv of the child: `[COMMAND, ARGS...]` or `["/bin/sh", "-c", SHELL_COMMAND]`.
    pub argv: Vec<OsString>,
}

impl Cli {
    /// `-q` and `-v` after the environment: a variable set to off is off, and a flag on the
    /// command line wins over a variable.
    pub fn verbosity(&self) -> Result<Verbosity> {
        match (self.quiet, self.verbose) {
            (false, false) => return Ok(Verbosity::Normal),
            (true, false) => return Ok(Verbosity::Quiet),
            (false, true) => return Ok(Verbosity::Verbose),
            (true, true) => {}
        }
        let cmdline = |s: Option<ValueSource>| s == Some(ValueSource::CommandLine);
        match (cmdline(self.given.quiet), cmdline(self.given.verbose)) {
            (true, true) => bail!("give either -q/--quiet or -v/--verbose, not both"),
            (true, false) => Ok(Verbosity::Quiet),
            (false, true) => Ok(Verbosity::Verbose),
            (false, false) => {
                bail!("CRONLOCK_QUIET and CRONLOCK_VERBOSE are both on: turn one of them off")
            }
        }
    }

    /// How many run records to keep (`--history N`).
    fn history_kept(&self) -> Result<u32> {
        match self.history {
            None => Ok(DEFAULT_HISTORY),
            Some(Count(Some(n))) => Ok(n),
            Some(Count(None)) => bail!("--history needs a number N of runs to keep"),
        }
    }

    /// The TLS options, checked together.
    fn tls(&self) -> Result<crate::store::tls::TlsOptions> {
        let tls = crate::store::tls::TlsOptions {
            ca_cert: self.tls_ca_cert.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        };
        tls.check()?;
        Ok(tls)
    }

    /// `--max-runtime`, where 0 means no limit.
    fn max_runtime(&self) -> Option<std::time::Duration> {
        self.max_runtime.map(|m| m.0).filter(|m| !m.is_zero())
    }

    /// The Redis URLs after the documented fallbacks (a value may hold several, separated by
    /// whitespace), and where they came from (for messages).
    fn redis_urls(&self) -> Result<RedisUrls> {
        use ValueSource::{CommandLine, EnvVariable};
        let url_given = (!self.redis_url.is_empty())
            .then_some(self.given.redis_url)
            .flatten();
        let file = match (url_given, self.given.redis_url_file) {
            (Some(CommandLine), Some(CommandLine)) => bail!(
                "--redis-url and --redis-url-file cannot be used together: give the URL one way"
            ),
            (Some(EnvVariable), Some(EnvVariable)) => bail!(
                "CRONLOCK_REDIS_URL and CRONLOCK_REDIS_URL_FILE are both set (a crontab's \
                 header and its line?): set one, or give -u or --redis-url-file on the line, \
                 which wins over both variables"
            ),
            // A flag wins over a variable: it is the more specific setting.
            (Some(CommandLine), _) => None,
            _ => self.redis_url_file.as_ref(),
        };
        let (urls, source): (Vec<String>, &'static str) = if let Some(path) = file {
            let source = named(
                self.given.redis_url_file,
                "--redis-url-file",
                "CRONLOCK_REDIS_URL_FILE",
            );
            let text = read_secret(path, source)?;
            (split_urls(&text), source)
        } else {
            let urls: Vec<String> = self.redis_url.iter().flat_map(|u| split_urls(u)).collect();
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
                    crate::store::url::redact_url(url)
                );
            }
        }
        Ok(RedisUrls { urls, source })
    }

    /// The `--ping` URL, from the flag, its variable or `--ping-url-file`.
    fn ping(&self) -> Result<Option<String>> {
        match &self.ping_url_file {
            Some(path) => {
                let source = named(
                    self.given.ping_url_file,
                    "--ping-url-file",
                    "CRONLOCK_PING_URL_FILE",
                );
                read_secret(path, source).map(Some)
            }
            None => Ok(self.ping_url.clone()),
        }
    }

    /// The wait actually used: `-n` wins over `-w`.
    fn wait(&self) -> std::time::Duration {
        if self.nonblock {
            std::time::Duration::ZERO
        } else {
            self.wait.0
        }
    }

    /// The checks of the mode asked ([`Cli::mode`]) that clap cannot express, in the order the
    /// messages promise: for a lock's admin mode, its KEY.
    pub(crate) fn checked_mode(&self) -> Result<Option<String>> {
        if self.crontab.is_some() {
            if self.key.is_some() || !self.command.is_empty() || self.shell_command.is_some() {
                bail!(
                    "--crontab takes no KEY and no COMMAND: they are on the file's lines{}",
                    if std::env::var_os("CRONLOCK_CRONTAB").is_some() {
                        " (CRONLOCK_CRONTAB is set)"
                    } else {
                        ""
                    }
                );
            }
            if self.mode != Mode::Crontab {
                bail!("--crontab serves jobs: it is not an admin mode's option");
            }
            return Ok(None);
        }
        if matches!(self.mode, Mode::Run | Mode::Crontab) {
            return Ok(None);
        }
        let runs_command = !self.command.is_empty() || self.shell_command.is_some();
        let flag = Mode::flags()
            .find(|f| f.mode == self.mode)
            .map(|f| f.flag())
            .unwrap_or_default();
        match self.mode {
            _ if runs_command => bail!("{flag} runs no command: remove COMMAND"),
            Mode::Next => {
                if let (Some(given), Some(key)) = (&self.next_key, &self.key) {
                    if given != key {
                        bail!("--next takes one KEY: give --key {given} or KEY {key}, not both");
                    }
                }
                return Ok(None);
            }
            Mode::List if self.key.is_some() => bail!("--list takes no KEY"),
            Mode::List => return Ok(None),
            _ => {}
        }
        match self.key.as_deref() {
            None | Some("") => bail!("{flag} needs a non-empty KEY"),
            Some(k) => check_key(k).map(Some),
        }
    }

    /// Checks that clap cannot express, each with a message naming what is wrong.
    pub(crate) fn target(&self) -> Result<RunTarget> {
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
        match (&self.schedule, &self.catch_up, &self.retries) {
            (None, Some(_), _) => bail!(
                "--catch-up needs --schedule: it catches up the instants of a schedule (or unset \
                 CRONLOCK_CATCH_UP)"
            ),
            (_, None, Some(_)) => bail!(
                "--retries needs --catch-up: a retry is run by a later firing inside the catch-up \
                 window (or unset CRONLOCK_RETRIES)"
            ),
            _ => {}
        }
        let allow = self.overlap.at_once().is_some();
        if self.limit > 1 && self.schedule.is_some() && !allow {
            bail!(
                "--schedule runs the job once per instant, so it takes no --limit above 1 (got \
                 --limit {}) but with --overlap allow, where it caps the instants running at once",
                self.limit
            );
        }
        Ok(RunTarget { key, argv })
    }
}

/// The Redis URLs given, and where they came from: the flag or variable, for messages.
pub(crate) struct RedisUrls {
    urls: Vec<String>,
    source: &'static str,
}

/// The flag or the variable, as clap says the user gave an option: for messages.
fn named(given: Option<ValueSource>, flag: &'static str, var: &'static str) -> &'static str {
    if given == Some(ValueSource::EnvVariable) {
        var
    } else {
        flag
    }
}

/// A secret read from a file: trimmed, never shown. A missing, unreadable or empty file is an
/// error naming `source` (the option or variable) and the path, not the content.
///
/// The file decides where cronlock connects (or what it reports to): like a crontab, it must be
/// owned by this user or root and writable by nobody else ([`crate::files::untrusted`]).
fn read_secret(path: &std::path::Path, source: &str) -> Result<String> {
    use std::io::Read;
    let cannot = |e: std::io::Error| {
        anyhow::anyhow!(
            "cannot read {source} '{}': {}",
            path.display(),
            crate::log::io_text(&e)
        )
    };
    let file = std::fs::File::open(path).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    let harm = "point cronlock at a server of theirs, or read what it sends";
    if let Some(why) = crate::files::untrusted(path, &meta, harm) {
        bail!("{source} '{}': {why}", path.display());
    }
    let mut text = Vec::new();
    // A URL is short; a secret file of megabytes is a mistake, not a URL.
    file.take(1 << 20).read_to_end(&mut text).map_err(cannot)?;
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
    let args = history_flag_apart(std::env::args_os());
    from_matches(&Cli::command().try_get_matches_from(args)?)
}

/// Whether `word` is the flag of a mode that runs no command (`--status`, `--list`, ...).
pub(crate) fn is_admin_flag(word: &str) -> bool {
    Mode::flags().any(|f| f.mode.runs_no_command() && f.flag() == word)
}

/// `--history` takes an optional count, so `--status --history KEY` would read KEY as the count:
/// in the modes that run no command (`--status`, `--check`, `--list`, `--force-release`, ...), a
/// `--history` whose next word is not a count (a number or `all`) stands alone, as
/// `--history=all`. (`--history=N` is the form that cannot be misread.) A run's COMMAND and its
/// arguments are never touched.
fn history_flag_apart(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.collect();
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let admin = args[..end]
        .iter()
        .any(|a| is_admin_flag(a.to_str().unwrap_or("")));
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

pub(crate) fn from_matches(matches: &ArgMatches) -> std::result::Result<Cli, clap::Error> {
    let mut cli = Cli::from_arg_matches(matches)?;
    cli.mode = Mode::of(matches);
    cli.given = Given {
        redis_url: matches.value_source("redis_url"),
        redis_url_file: matches.value_source("redis_url_file"),
        ping_url_file: matches.value_source("ping_url_file"),
        quiet: matches.value_source("quiet"),
        verbose: matches.value_source("verbose"),
        history_flag: matches.value_source("history") == Some(ValueSource::CommandLine),
    };
    Ok(cli)
}

/// The clap command, for the man page and completion generators.
pub fn command() -> clap::Command {
    Cli::command()
}

/// The URLs in one value: several masters' URLs separated by whitespace, or one URL whose
/// password holds whitespace. Split only when every part is a URL (has a scheme): otherwise a
/// password with a space would be cut in two, and half of it shown as a URL that does not parse.
fn split_urls(text: &str) -> Vec<String> {
    let parts: Vec<&str> = text.split_whitespace().collect();
    if parts.len() > 1 && !parts.iter().all(|p| p.contains("://")) {
        return vec![text.trim().to_string()];
    }
    parts.into_iter().map(str::to_string).collect()
}

#[cfg(test)]
mod tests;
