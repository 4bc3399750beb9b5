//! The help that is not about one option: the exit-status table, the examples and what the
//! command finds in its environment. One source for `--help` (after the options), the man page
//! (`tests/suite/docs.rs` generates it) and the README's table (checked against it).

/// The exit-status table: one source for `--help`, the man page and the tests.
pub const EXIT_STATUS: &[(&str, &str)] = &[
    ("the child's own", "the command ran and exited"),
    ("128+N", "the command was killed by signal N"),
    (
        "-E (default 0)",
        "the lock is held elsewhere (or --wait ran out, the --schedule instant already ran, nothing \
         is due, KEY is suspended; with --trigger: the manual instant was skipped, KEY suspended \
         or busy with a run that started before the trigger); the command did not run",
    ),
    (
        "122",
        "the lock was lost: the command was terminated (or not started, when the lock was granted \
         too late to be safe; or stopped after an internal error)",
    ),
    (
        "124",
        "the command was terminated because it ran past --max-runtime (with --trigger --wait: \
         the run did not end within the wait)",
    ),
    (
        "125",
        "cronlock itself failed (bad usage or value, Redis unreachable, authentication refused, \
         unexpected reply, no process for the command); the command did not run",
    ),
    ("126", "the command was found but could not be executed"),
    ("127", "the command was not found"),
    (
        "69",
        "with --trigger: no replica serving KEY took it; nothing was left in Redis",
    ),
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
    "The command gets CRONLOCK_KEY, CRONLOCK_TOKEN, CRONLOCK_FENCING_TOKEN and CRONLOCK_RUN_ID in \
     its environment; with --limit, CRONLOCK_SLOT; with --schedule, CRONLOCK_INSTANT (RFC 3339), \
     CRONLOCK_INSTANT_MS (Unix ms), CRONLOCK_MANUAL (1 for a --trigger, else 0) and \
     CRONLOCK_ATTEMPT.";

pub(super) fn after_long_help() -> String {
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
