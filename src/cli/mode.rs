//! What the command line asks for ([`Mode`]), decided while it is parsed from the one mode
//! flag given, and every mode flag, listed once ([`Mode::flags`]).

use clap::parser::ValueSource;

/// What the command line asks for: a run (the default), an admin mode, `--next` or a replica.
/// Decided while parsing, from the one mode flag given ([`Mode::flags`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Run,
    Status,
    Check,
    List,
    ForceRelease,
    Suspend,
    Resume,
    Trigger,
    Next,
    Crontab,
}

/// A mode's flag: its clap id, and what it asks for.
#[derive(Debug, Clone, Copy)]
pub struct ModeFlag {
    pub id: &'static str,
    pub mode: Mode,
    /// It names no KEY (`--list`, `--next`: it may take one; `--crontab`: its lines do).
    pub keyless: bool,
}

/// Every mode flag, once.
const MODE_FLAGS: [ModeFlag; 9] = [
    ModeFlag::of("status", Mode::Status, false),
    ModeFlag::of("check", Mode::Check, false),
    ModeFlag::of("list", Mode::List, true),
    ModeFlag::of("force_release", Mode::ForceRelease, false),
    ModeFlag::of("suspend", Mode::Suspend, false),
    ModeFlag::of("resume", Mode::Resume, false),
    ModeFlag::of("trigger", Mode::Trigger, false),
    ModeFlag::of("next", Mode::Next, true),
    ModeFlag::of("crontab", Mode::Crontab, true),
];

impl ModeFlag {
    const fn of(id: &'static str, mode: Mode, keyless: bool) -> ModeFlag {
        ModeFlag { id, mode, keyless }
    }

    /// The flag as typed: `--force-release`.
    pub fn flag(&self) -> String {
        format!("--{}", self.id.replace('_', "-"))
    }
}

impl Mode {
    /// Every mode flag, once: the source of clap's group of them, of KEY's exceptions and of
    /// what a crontab line refuses.
    pub fn flags() -> impl Iterator<Item = ModeFlag> {
        MODE_FLAGS.into_iter()
    }

    /// The mode `matches` asks for: the admin mode whose flag was given (clap lets one through),
    /// else a replica with `--crontab` (or its variable), else a run.
    pub fn of(matches: &clap::ArgMatches) -> Mode {
        let given = |id: &str| {
            matches!(
                matches.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        };
        let admin = Mode::flags().find(|f| f.mode != Mode::Crontab && given(f.id));
        match admin {
            Some(f) => f.mode,
            None if given("crontab") => Mode::Crontab,
            None => Mode::Run,
        }
    }

    /// An admin mode, or `--next`: it runs no command.
    pub fn runs_no_command(self) -> bool {
        !matches!(self, Mode::Run | Mode::Crontab)
    }
}
