//! clap's errors as cronlock's one line: the first paragraph only, the flag named plainly, the
//! variable named when the bad value came from one, and a hint at the option meant.

use clap::CommandFactory;

use crate::cli::args::*;

/// The variable an invalid value came from, when it did not come from the command line.
fn invalid_from_env(err: &clap::Error) -> Option<String> {
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
    (from_env && !on_cmdline).then_some(var)
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
                Some(var) => format!(" for {flag} (from {var})"),
                None => format!(" for {flag}"),
            };
            message.replace_range(start..quote + 1, &named);
        }
    }
    use clap::error::{ContextKind, ContextValue};
    // --max-jobs or --drain (or their variables) without --crontab: name them.
    if err.kind() == clap::error::ErrorKind::MissingRequiredArgument
        && message.contains("--crontab <FILE>")
    {
        let given: Vec<String> = [
            ("--max-jobs", "CRONLOCK_MAX_JOBS"),
            ("--drain", "CRONLOCK_DRAIN"),
            ("--listen", "CRONLOCK_LISTEN"),
        ]
        .iter()
        .filter_map(|(flag, var)| {
            let on_line =
                std::env::args().any(|a| a == *flag || a.starts_with(&format!("{flag}=")));
            if on_line {
                Some(flag.to_string())
            } else {
                std::env::var_os(var).map(|_| var.to_string())
            }
        })
        .collect();
        if !given.is_empty() {
            message = format!(
                "{} only applies to a replica: it needs --crontab",
                given.join(" and ")
            );
        }
    }
    if let Some(ContextValue::String(similar)) = err.get(ContextKind::SuggestedArg) {
        message += &format!("; a similar argument exists: '{similar}'");
    }
    format!("{message} (see 'cronlock --help')")
}
