//! What the command line asks for, as one [`Request`]: a replica of a crontab (read by
//! `crontab.rs`), or a run or an admin mode (resolved by `resolve.rs`, which a crontab's lines use
//! too, so neither imports the other's caller).

use anyhow::Result;

use crate::cli::{crontab, resolve, Cli, Mode};
use crate::config::Request;

/// The mode the command line names, resolved into its plain value.
pub fn request(cli: &Cli) -> Result<Request> {
    let key = cli.checked_mode()?;
    match (cli.mode, cli.crontab.clone()) {
        (Mode::Crontab, Some(file)) if cli.test => {
            crontab::replica(cli, file).map(|r| Request::TestCrontab(Box::new(r)))
        }
        (Mode::Crontab, Some(file)) => {
            crontab::replica(cli, file).map(|r| Request::Crontab(Box::new(r)))
        }
        (Mode::Next, _) => resolve::next(cli).map(|q| Request::Next(Box::new(q))),
        _ => resolve::resolve(cli, key),
    }
}
