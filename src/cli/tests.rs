//! The command line's checks: modes, the history flag, arguments that go to the command.

use super::*;

#[test]
fn verify_cli() {
    Cli::command().debug_assert();
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
    assert_eq!(cli.target().unwrap().argv, vec!["ls", "-la", "--color"]);
    let cli = parse(&["-v", "k", "--", "ls", "-v"]);
    assert!(cli.verbose);
    assert_eq!(cli.target().unwrap().argv, vec!["ls", "-v"]);
}

#[test]
fn shell_command() {
    let cli = parse(&["k", "-c", "echo hi"]);
    assert_eq!(cli.target().unwrap().argv, vec!["/bin/sh", "-c", "echo hi"]);
    assert!(parse(&["k", "-c", "x", "ls"]).target().is_err());
    assert!(parse(&["k"]).target().is_err());
    assert!(parse(&["", "true"]).target().is_err());
}

/// `config::REPLICA_OPTIONS` is the clap definition's list: exactly the options clap refuses
/// without `--crontab` (directly, or through another such option, as `--show-output` through
/// `--listen`), and `--crontab` itself, each with its variable.
#[test]
fn replica_options_are_those_that_need_crontab() {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let command = Cli::command();
    // What clap says is missing when `--FLAG [VALUE]` is given alone before a run.
    let missing = |arg: &clap::Arg| -> Option<Vec<String>> {
        let flag = format!("--{}", arg.get_long()?);
        let takes_value = arg.get_action().takes_values();
        let values: &[&str] = if takes_value {
            &["1", "1s", ":0", "x"]
        } else {
            &[""]
        };
        for value in values {
            let mut argv = vec!["cronlock", &flag];
            if takes_value {
                argv.push(value);
            }
            argv.extend(["k", "--", "true"]);
            let Err(e) = Cli::command().try_get_matches_from(argv) else {
                return Some(Vec::new());
            };
            match e.kind() {
                ErrorKind::ValueValidation | ErrorKind::InvalidValue => continue,
                ErrorKind::MissingRequiredArgument => {
                    return match e.get(ContextKind::InvalidArg) {
                        Some(ContextValue::Strings(s)) => Some(
                            s.iter()
                                .map(|m| m.split(' ').next().unwrap_or(m).to_string())
                                .collect(),
                        ),
                        _ => Some(Vec::new()),
                    }
                }
                _ => return Some(Vec::new()),
            }
        }
        None
    };
    let mut replica: Vec<String> = vec!["--crontab".into()];
    let needs: Vec<(String, Vec<String>)> = command
        .get_arguments()
        .filter_map(|a| Some((format!("--{}", a.get_long()?), missing(a)?)))
        .collect();
    loop {
        let before = replica.len();
        for (flag, missing) in &needs {
            if !missing.is_empty()
                && missing.iter().all(|m| replica.contains(m))
                && !replica.contains(flag)
            {
                replica.push(flag.clone());
            }
        }
        if replica.len() == before {
            break;
        }
    }
    replica.sort();
    let mut listed: Vec<String> = crate::config::REPLICA_OPTIONS
        .iter()
        .map(|o| o.flag.to_string())
        .collect();
    listed.sort();
    assert_eq!(listed, replica);
    for option in crate::config::REPLICA_OPTIONS {
        let arg = command
            .get_arguments()
            .find(|a| {
                a.get_long()
                    .is_some_and(|l| format!("--{l}") == option.flag)
            })
            .unwrap();
        assert_eq!(
            arg.get_env().and_then(|e| e.to_str()),
            Some(option.variable),
            "{}",
            option.flag
        );
    }
}

/// `--overlap` reads each policy by the word the scripts get, and names them all when a value
/// is none of them.
#[test]
fn overlap_policies_read_by_their_words() {
    use crate::store::overlap::Overlap;
    for policy in Overlap::ALL {
        assert_eq!(args::overlap(policy.word()), Ok(policy));
    }
    assert_eq!(
        args::overlap("nope"),
        Err("expected skip, queue, replace or allow".to_string())
    );
}
