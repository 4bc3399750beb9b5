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
