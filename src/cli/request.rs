//! What the command line asks for, as one [`Request`]: a replica of a crontab (read by
//! `crontab.rs`), or a run or an admin mode (resolved by `resolve.rs`, which a crontab's lines use
//! too, so neither imports the other's caller).

use anyhow::Result;

use crate::cli::{crontab, resolve, Cli, Mode};
use crate::config::Request;

/// The mode the command line names, resolved into its plain value.
pub fn request(cli: &Cli) -> Result<Request> {
    match cli.mode()? {
        Mode::Crontab(file) if cli.test => {
            crontab::replica(cli, file).map(|r| Request::TestCrontab(Box::new(r)))
        }
        Mode::Crontab(file) => crontab::replica(cli, file).map(|r| Request::Crontab(Box::new(r))),
        Mode::Next => resolve::next(cli).map(|q| Request::Next(Box::new(q))),
        mode => resolve::resolve(cli, mode),
    }
}
