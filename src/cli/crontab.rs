//! `--crontab FILE`: the file read into [`config::CronJob`]s, each line checked exactly as the run
//! it makes would be checked (`cronlock --schedule SCHEDULE [OPTIONS] KEY -c COMMAND-LINE` goes
//! through the same parser and resolution), so a bad line is one `FILE:LINE: message` at start,
//! and a SIGHUP that reads a broken file keeps the old table.
//!
//! The format is a crontab's: comments (`#`) and blank lines; `NAME=value` lines, the environment
//! of the jobs below them (`CRON_TZ=` the time zone of their schedules); job lines
//! `SCHEDULE [OPTIONS] KEY COMMAND-LINE`, the schedule 5 fields, 6 with seconds first, or an
//! `@hourly`-style nickname (six words that could all be cron fields are a 6-field schedule, so a
//! KEY after 5 fields must not look like one: `5` or `*/2`). COMMAND-LINE is the rest of the
//! line, run by `/bin/sh -c` as cron runs it (`%` is not special).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use clap::CommandFactory;

use crate::cli::{from_matches, is_admin_flag, one_line, Cli};
use crate::config::{CronJob, Env, JobRun, Replica, Variable, REPLICA_OPTIONS};
use crate::fleet::schedule::Schedule;
use crate::signals;

/// The largest crontab read: a table, not data.
const MAX_FILE: u64 = 1 << 20;

/// Options that belong to the line itself, never to one job's OPTIONS (nor do the replica's,
/// [`REPLICA_OPTIONS`], or the modes' flags, [`crate::cli::Mode::flags`]).
const OF_THE_LINE: [&str; 9] = [
    "--schedule",
    "--wait",
    "-w",
    "-c",
    "--command",
    "--help",
    "-h",
    "--version",
    "-V",
];

/// The replica `--crontab FILE` asks for: its jobs read (answering SIGTERM and SIGINT while it
/// reads) and its own settings.
pub fn replica(cli: &Cli, file: PathBuf) -> Result<Replica> {
    Ok(Replica {
        jobs: load_answering(&file)?,
        file,
        max_jobs: cli.max_jobs,
        drain: cli.drain.0,
        listen: cli.listen,
        show_output: cli.show_output,
        grace: cli.grace.map_or(Duration::from_secs(5), |g| g.0),
    })
}

/// [`load`] on a thread of its own, while this (the main) thread answers SIGTERM and SIGINT: a
/// file that reads slowly (a hung network filesystem, a huge file) never keeps a replica from
/// ending, at start or on reload. A signal is the error [`signals::Interrupted`].
pub fn load_answering(path: &Path) -> Result<Vec<CronJob>> {
    let (done, read) = std::sync::mpsc::channel();
    let owned = path.to_path_buf();
    std::thread::Builder::new()
        .name("crontab".into())
        .spawn(move || {
            let _ = done.send(load(&owned));
            signals::wake_main();
        })
        .map_err(|e| anyhow!("cannot start reading {}: {e}", path.display()))?;
    let set = signals::SigSet::of(&[libc::SIGTERM, libc::SIGINT, signals::WAKEUP]);
    loop {
        if let Ok(jobs) = read.try_recv() {
            return jobs;
        }
        // Bounded: the reader's end wakes this wait, and nothing else is waited for.
        if let Some(sig @ (libc::SIGTERM | libc::SIGINT)) =
            signals::wait(&set, std::time::Duration::from_millis(200))
        {
            return Err(signals::Interrupted(sig).into());
        }
    }
}

/// Read and check `path`: every job, or the first line at fault as `FILE:LINE: message`.
pub fn load(path: &Path) -> Result<Vec<CronJob>> {
    let shown = path.display();
    let text = read(path).map_err(|e| anyhow!("{shown}{e}"))?;
    let mut jobs: Vec<CronJob> = Vec::new();
    // The environment so far, shared by the jobs below it until the next `NAME=value` line
    // (copied then, once), with each name's place: reading is linear in the file's size.
    let mut env: Env = Arc::default();
    let mut place: HashMap<String, usize> = HashMap::new();
    let mut zone: Option<String> = None;
    let mut lines_of: HashMap<String, usize> = HashMap::new();
    // Built once: clap's definition is tens of KiB, too much to build again for every line of a
    // large file.
    // The replica's own options, given as variables, are the replica's: a job line never reads
    // them (they would be refused there: they need --crontab).
    let mut command = Cli::command();
    for option in REPLICA_OPTIONS {
        let id = option.flag.trim_start_matches('-').replace('-', "_");
        command = command.mut_arg(id, |a| a.env(None));
    }
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let n = i + 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(Variable { name, value }) = assignment(line) {
            if name.starts_with("CRONLOCK_") {
                bail!(
                    "{shown}:{n}: {name} is cronlock's own setting: give the option on the job's \
                     line, or set it for every job in the replica's environment"
                );
            }
            if name == "CRON_TZ" {
                zone = Some(value);
            } else {
                let vars = Arc::make_mut(&mut env);
                match place.get(&name) {
                    Some(&i) => vars[i].value = value,
                    None => {
                        place.insert(name.clone(), vars.len());
                        vars.push(Variable { name, value });
                    }
                }
            }
            continue;
        }
        let job = job(line, zone.as_deref(), &env, n, &mut command)
            .map_err(|e| anyhow!("{shown}:{n}: {e:#}"))?;
        if let Some(first) = lines_of.insert(job.key.clone(), n) {
            bail!(
                "{shown}:{n}: KEY '{}' is already the KEY of line {first}: each job needs its own",
                job.key
            );
        }
        jobs.push(job);
    }
    Ok(jobs)
}

/// The file's text: a regular file, at most [`MAX_FILE`] bytes, UTF-8. An error reads after
/// the file's name: `: reason`, or `:LINE: reason` for a byte that is not UTF-8.
fn read(path: &Path) -> Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking, so a FIFO nobody writes is refused at once instead of hanging the open.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| anyhow!(": {}", crate::log::io_text(&e)))?;
    let meta = file
        .metadata()
        .map_err(|e| anyhow!(": {}", crate::log::io_text(&e)))?;
    if !meta.is_file() {
        let what = kind(&meta);
        bail!(": not a regular file ({what}): a crontab is read from a file");
    }
    // The file decides what runs, as this replica's user: its owner and nobody else may change it.
    let harm = "run commands as this replica's user";
    if let Some(why) = crate::files::untrusted(path, &meta, harm) {
        bail!(": {why}");
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| anyhow!(": {}", crate::log::io_text(&e)))?;
    if bytes.len() as u64 > MAX_FILE {
        bail!(": larger than {} KiB", MAX_FILE / 1024);
    }
    String::from_utf8(bytes).map_err(|e| {
        let good = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = good.iter().filter(|b| **b == b'\n').count() + 1;
        anyhow!(":{line}: not UTF-8 text (a byte that is not, on this line)")
    })
}

/// What a file that is not a regular one is, for people.
fn kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a file"
    }
}

/// `NAME=value` (the value unquoted), when the line is one.
fn assignment(line: &str) -> Option<Variable> {
    let (name, value) = line.split_once('=')?;
    let name = name.trim();
    let mut chars = name.chars();
    let first = chars.next()?;
    if !(first.is_ascii_alphabetic() || first == '_')
        || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return None;
    }
    let value = value.trim();
    let unquoted = ['"', '\'']
        .iter()
        .find_map(|q| value.strip_prefix(*q)?.strip_suffix(*q))
        .unwrap_or(value);
    Some(Variable {
        name: name.to_string(),
        value: unquoted.to_string(),
    })
}

/// A word of a line, and where it ends (the rest of the line, after KEY, is the command).
struct Word<'a> {
    text: &'a str,
    end: usize,
}

/// The words of `text`, split on whitespace.
fn words(text: &str) -> Vec<Word<'_>> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                out.push(Word {
                    text: &text[s..i],
                    end: i,
                });
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push(Word {
            text: &text[s..],
            end: text.len(),
        });
    }
    out
}

/// A word that can stand in a cron field (so a 6th one makes a 6-field schedule).
fn cron_field(word: &str) -> bool {
    word.chars()
        .all(|c| c.is_ascii_digit() || "*/,-?LW#H()".contains(c))
        || word
            .split([',', '-', '/'])
            .all(|p| p.len() == 3 && p.chars().all(|c| c.is_ascii_alphabetic()))
}

/// One job line.
fn job(
    line: &str,
    zone: Option<&str>,
    env: &Env,
    n: usize,
    command: &mut clap::Command,
) -> Result<CronJob> {
    let all = words(line);
    let fields = if all[0].text.starts_with('@') {
        1
    } else if all.len() >= 6 && all[..6].iter().all(|w| cron_field(w.text)) {
        6
    } else {
        5
    };
    if all.len() <= fields {
        bail!("a job line is SCHEDULE [OPTIONS] KEY COMMAND-LINE: it has no KEY");
    }
    let expr = line[..all[fields - 1].end].trim();
    let text = match zone {
        Some(z) => format!("CRON_TZ={z} {expr}"),
        None => expr.to_string(),
    };
    let schedule = Schedule::parse(&text).map_err(|e| anyhow!("bad schedule '{expr}': {e}"))?;
    // The options, up to KEY: an option that takes a value takes the next word too.
    let mut words: Vec<String> = vec!["--schedule".into(), text];
    let mut rest = all[fields..].iter();
    let mut key = None;
    while let Some(&Word { text: word, end }) = rest.next() {
        if !word.starts_with('-') || word == "-" {
            key = Some(Word { text: word, end });
            break;
        }
        let name = word.split('=').next().unwrap_or(word);
        let replicas = REPLICA_OPTIONS.iter().any(|o| o.flag == name);
        if replicas || OF_THE_LINE.contains(&name) || is_admin_flag(name) {
            bail!("{name} is not an option of one job");
        }
        words.push(word.to_string());
        if !word.contains('=') && takes_value(command, name) {
            match rest.next() {
                Some(value) => words.push(value.text.to_string()),
                None => bail!("{name} needs a value"),
            }
        }
    }
    let Some(Word {
        text: key,
        end: key_end,
    }) = key
    else {
        bail!("a job line is SCHEDULE [OPTIONS] KEY COMMAND-LINE: it has no KEY");
    };
    let key = key.to_string();
    let shell = line[key_end..].trim();
    if shell.is_empty() {
        bail!("a job line is SCHEDULE [OPTIONS] KEY COMMAND-LINE: KEY '{key}' has no command");
    }
    words.extend([key.clone(), "-c".into(), shell.to_string()]);
    // The run this line makes, checked and resolved as that run's command line would be.
    let mut argv = vec!["cronlock".to_string()];
    argv.extend(words.iter().cloned());
    let matches = command
        .try_get_matches_from_mut(&argv)
        .map_err(|e| anyhow!(one_line(&e)))?;
    let cli = from_matches(&matches).map_err(|e| anyhow!(one_line(&e)))?;
    if cli.mode != crate::cli::Mode::Run {
        bail!("line {n} is not a run");
    }
    let target = cli.target()?;
    let config = super::resolve::run_config(&cli, target)?;
    let schedule = match &config.schedule {
        Some(keyed) => keyed.clone(),
        None => schedule,
    };
    let run = JobRun {
        config: Arc::new(config),
        env: env.clone(),
        verbosity: cli.verbosity()?,
        format: cli.log_format,
    };
    Ok(CronJob {
        line: n,
        key,
        schedule,
        words,
        run,
    })
}

/// One job line as [`load`] reads it, for other rooms' unit tests.
#[cfg(test)]
pub fn job_line(line: &str) -> CronJob {
    job(line, None, &Env::default(), 1, &mut Cli::command()).expect("a job line")
}

/// Whether the option `name` (`--ttl`, `-t`) takes a value of its own.
fn takes_value(command: &clap::Command, name: &str) -> bool {
    command.get_arguments().any(|a| {
        let named = match name.strip_prefix("--") {
            Some(long) => a.get_long() == Some(long),
            None => name.len() == 2 && a.get_short() == name.chars().nth(1),
        };
        named
            && a.get_action().takes_values()
            && a.get_num_args().is_none_or(|r| r.min_values() > 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(line: &str, zone: Option<&str>, env: &[Variable], n: usize) -> Result<CronJob> {
        super::job(line, zone, &Arc::new(env.to_vec()), n, &mut Cli::command())
    }

    #[test]
    fn lines_split_into_schedule_options_key_and_command() {
        let j = job(
            "*/5 * * * * --ttl 1m -v report  echo 'a  b' | tee x",
            None,
            &[],
            1,
        )
        .unwrap();
        assert_eq!(j.key, "report");
        assert_eq!(
            j.words,
            [
                "--schedule",
                "*/5 * * * *",
                "--ttl",
                "1m",
                "-v",
                "report",
                "-c",
                "echo 'a  b' | tee x"
            ]
        );
        let j = job("*/2 * * * * * k true", Some("UTC"), &[], 1).unwrap();
        assert_eq!(j.words[1], "CRON_TZ=UTC */2 * * * * *");
        let j = job("@hourly --catch-up=1h k true", None, &[], 1).unwrap();
        assert!(j.run.config.catch_up.is_some());
        assert!(job("* * * * * --wait 5s k true", None, &[], 1).is_err());
        assert!(job("* * * * * k", None, &[], 1).is_err());
        assert!(job("* * * * * --nope k true", None, &[], 1).is_err());
    }

    /// What the replica resolved is what its starter's child runs: the run crosses whole.
    #[test]
    fn a_job_run_reads_back_as_it_resolved() {
        use crate::starting::message::{Plan, StarterMessage};
        let env = [Variable {
            name: "A".into(),
            value: "b c".into(),
        }];
        let line = "H/5 * * * * --ttl 1m -v -u redis://:sec%20ret@localhost:1/2 report echo 'a  b'";
        let run = job(line, Some("UTC"), &env, 1).unwrap().run;
        let back = Plan::of(&run).unwrap().read().unwrap();
        let (a, b) = (&run.config, &back.config);
        assert_eq!(a.key, b.key);
        assert_eq!(a.argv, b.argv);
        assert_eq!(a.timing.ttl, b.timing.ttl);
        assert_eq!(a.servers[0].shown_url, b.servers[0].shown_url);
        assert_eq!(a.servers[0].fingerprint, b.servers[0].fingerprint);
        let (sa, sb) = (a.schedule.as_ref().unwrap(), b.schedule.as_ref().unwrap());
        assert_eq!((&sa.text, &sa.resolved), (&sb.text, &sb.resolved));
        assert_eq!(sa.next_after(0), sb.next_after(0));
        assert_eq!((&run.env, run.verbosity), (&back.env, back.verbosity));
        assert_eq!(Plan::of(&back).unwrap(), Plan::of(&run).unwrap());
        // The password crosses, and no message's Debug shows it.
        let m = StarterMessage::Start {
            id: 1,
            key: "k".into(),
            run: Plan::of(&run).unwrap(),
        };
        assert!(Plan::of(&run).unwrap().text().contains("sec%20ret"));
        assert!(!format!("{m:?}").contains("sec"));
    }
}
