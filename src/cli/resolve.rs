//! The command line resolved into what it asks for ([`crate::config`]): every check done, every
//! secret file read and every URL resolved to a topology, before anything talks to Redis.
//!
//! It exists so that the rest of cronlock is handed one plain value (ripgrep's `LowArgs` →
//! `HiArgs`, uutils' `Config::from(&matches)`): nothing below `lib.rs` sees [`Cli`], and a run
//! described some other way (a crontab line) is started the same way.

use anyhow::{bail, Result};

use crate::cli::{Cli, Mode};
use crate::config::{Admin, AdminMode, Replica, Reports, Request, RunConfig};
use crate::lease::Timing;
use crate::store::topology::Redis;

impl Cli {
    /// What the command line asks for, checked in the order the messages promise: the mode and
    /// its arguments, then the run's timing and history, the servers, and the reports.
    pub fn resolve(&self) -> Result<Request> {
        let mode = self.mode()?;
        if let Mode::Crontab(file) = mode {
            return Ok(Request::Crontab(Box::new(Replica {
                jobs: super::crontab::load_answering(&file)?,
                file,
                max_jobs: self.max_jobs,
                drain: self.drain.0,
                listen: self.listen,
                grace: self
                    .grace
                    .map_or(std::time::Duration::from_secs(5), |g| g.0),
            })));
        }
        let Mode::Run(target) = mode else {
            return self.admin(mode).map(|a| Request::Admin(Box::new(a)));
        };
        // Checked before anything else, so a bad value never runs the command.
        let history = self.history_kept()?;
        let timing = Timing::new(self.ttl.0, self.grace.map(|g| g.0))?;
        let servers = self.servers()?;
        if self.catch_up.is_some() && servers.len() > 1 {
            bail!(
                "--catch-up needs one Redis (plain, Sentinel or Cluster): with several \
                 independent masters each would keep its own ledger of instants, and a retry \
                 could be judged due on some and not on others"
            );
        }
        let reports = self.reports()?;
        Ok(Request::Run(Box::new(RunConfig {
            key: target.key,
            argv: target.argv,
            prefix: self.prefix.clone(),
            servers,
            connect_timeout: self.connect_timeout.0,
            timing,
            wait: self.wait(),
            limit: self.limit,
            schedule: self.schedule.clone(),
            handover: handover_fd()?,
            catch_up: self.catch_up.map(|c| c.0),
            retries: self.retries.unwrap_or(0),
            conflict_exit_code: self.conflict_exit_code,
            max_runtime: self.max_runtime(),
            min_hold: self.min_hold.0,
            history,
            history_ttl: self.history_ttl.map(|t| t.0),
            reports,
        })))
    }

    /// An admin mode with what it needs.
    fn admin(&self, mode: Mode) -> Result<Admin> {
        let mode = match mode {
            Mode::Run(_) | Mode::Crontab(_) => unreachable!("not an admin mode"),
            Mode::Status(key) => AdminMode::Status {
                key,
                history: self
                    .given
                    .history_flag
                    .then(|| self.history.and_then(|c| c.0)),
                schedule: self.schedule.clone(),
            },
            Mode::Check(key) => AdminMode::Check {
                key,
                max_age: self.max_age.map(|m| m.0),
                schedule: self.schedule.clone(),
            },
            Mode::List => AdminMode::List,
            Mode::ForceRelease(key) => AdminMode::ForceRelease {
                key,
                token: self.token.clone(),
            },
            Mode::Suspend(key) => AdminMode::Suspend {
                key,
                reason: self.reason.clone(),
            },
            Mode::Resume(key) => AdminMode::Resume { key },
        };
        Ok(Admin {
            mode,
            prefix: self.prefix.clone(),
            servers: self.servers()?,
            timeout: self.connect_timeout.0,
            json: self.json,
        })
    }

    /// The Redis URL(s), each resolved to one topology.
    fn servers(&self) -> Result<Vec<Redis>> {
        let (urls, source) = self.redis_urls()?;
        let tls = self.tls()?;
        let redis = urls
            .iter()
            .map(|url| Redis::new(url, source, self.connect_timeout.0, &tls, self.min_replicas))
            .collect::<Result<Vec<Redis>>>()?;
        if self.limit > 1 && redis.len() > 1 {
            bail!(
                "--limit {} needs one Redis (plain, Sentinel or Cluster): with several independent \
                 masters the holders of a KEY could not be counted safely",
                self.limit
            );
        }
        Ok(redis)
    }

    /// The reports; a `--metrics-dir` that is not a directory is an error before the lock is
    /// taken, and so is an unreadable `--ping-url-file`.
    fn reports(&self) -> Result<Reports> {
        if let Some(dir) = self.metrics_dir.as_deref().filter(|d| !d.is_dir()) {
            bail!(
                "--metrics-dir {} is not a directory (or CRONLOCK_METRICS_DIR)",
                dir.display()
            );
        }
        Ok(Reports {
            metrics_dir: self.metrics_dir.clone(),
            ping_url: self.ping()?,
            ping_body: self.ping_body,
        })
    }
}

/// The channel a replica (`--crontab`) hands its run's lock over on: a descriptor number.
fn handover_fd() -> Result<Option<i32>> {
    let var = crate::fleet::handover::FD_VAR;
    match std::env::var(var) {
        Err(_) => Ok(None),
        Ok(v) => v.parse::<i32>().map(Some).map_err(|_| {
            anyhow::anyhow!(
                "invalid value '{v}' for {var} (set by --crontab for its runs: a descriptor \
                 number)"
            )
        }),
    }
}
