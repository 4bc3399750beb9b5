//! The common invocation without clap (see [`common_case`]).

use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::ValueEnum;

use crate::cli::args::{Cli, Given, LogFormat};
use crate::duration::{self, Span};

/// The way cronlock is run on every tick of every host, `cronlock KEY [--] COMMAND [ARGS...]`
/// with settings from a few variables, parsed without clap: building clap's command definition
/// costs about a quarter of a millisecond per run, a tenth of the whole run. It accepts only what
/// is unambiguous and known to mean the same to clap (same value parsers, same defaults; the test
/// `the_common_case_parses_as_clap_does` compares the two), and returns `None` for anything
/// else: any option, any other `CRONLOCK_*` variable, a value that does not parse (clap then
/// says what is wrong).
pub(super) fn common_case(
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
    let mut cli = defaults(key, command)?;
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

/// Every field of [`Cli`] at clap's default, for `KEY COMMAND...`: a new field does not compile
/// here until it has one.
fn defaults(key: String, command: Vec<OsString>) -> Option<Cli> {
    Some(Cli {
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
        catch_up: None,
        retries: None,
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
        keep_output: None,
        log_format: LogFormat::Text,
        status: false,
        check: false,
        max_age: None,
        list: false,
        force_release: false,
        suspend: false,
        reason: None,
        suspend_for: None,
        jitter: None,
        overlap: crate::store::overlap::Overlap::Skip,
        resume: false,
        trigger: false,
        crontab: None,
        max_jobs: 16,
        drain: Span(std::time::Duration::from_secs(25)),
        listen: None,
        test: false,
        show_output: false,
        next: None,
        count: 5,
        next_key: None,
        from: None,
        token: None,
        json: false,
        key: Some(key),
        command,
        given: Given {
            redis_url: None,
            redis_url_file: None,
            ping_url_file: None,
            quiet: Some(ValueSource::DefaultValue),
            verbose: Some(ValueSource::DefaultValue),
            history_flag: false,
        },
        mode: crate::cli::Mode::Run,
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use clap::CommandFactory;

    use super::super::from_matches;
    use super::*;

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
                .args(["--exact", "cli::common::tests::common_case_in_this_process"])
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
}
