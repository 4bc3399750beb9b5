//! `--ping URL`: a dead-man's switch in the Healthchecks protocol, which Cronitor and others accept
//! too. `URL/start` when the command starts, `URL` when it exits 0, `URL/N` with its status N
//! otherwise (lost lock `/122`, `--max-runtime` `/124`, not started `/126`, `/127`). A host that
//! skips sends nothing: the host that runs the job pings.
//!
//! Pings never change the outcome: each is bounded (two attempts of [`ATTEMPT`] each), the start
//! ping runs on a thread of its own so the command starts at once, and a failed ping is one warning
//! line. The URL is a secret (whoever has it can ping), so no message ever contains it.
//! HTTPS uses rustls with ring, as the Redis connection does, through the well-kept `ureq` client.

use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::log::{Level, Log};

/// One HTTP attempt's limit, connect included.
pub const ATTEMPT: Duration = Duration::from_secs(2);
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// Pings for one run.
pub struct Pinger {
    url: String,
    /// Made on first use, off the command's start: loading the CA store takes milliseconds.
    agent: Arc<OnceLock<ureq::Agent>>,
    log: Log,
    start: Option<JoinHandle<()>>,
    /// `rid=`: the attempt's run id (`CRONLOCK_RUN_ID`), so overlapping pings are told apart.
    rid: Option<String>,
}

impl Pinger {
    /// Check `url` (only its scheme is named in errors: the rest is a secret).
    pub fn new(url: &str, log: &Log) -> Result<Pinger> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("--ping (or CRONLOCK_PING_URL) must be an http:// or https:// URL");
        }
        Ok(Pinger {
            url: url.trim_end_matches('/').to_string(),
            agent: Arc::default(),
            log: log.clone(),
            start: None,
            rid: None,
        })
    }

    /// `URL/start?rid=RUN_ID`, sent in the background: the command does not wait for it.
    pub fn started(&mut self, run_id: &str) {
        self.rid = Some(run_id.to_string());
        let (agent, url, log) = (
            self.agent.clone(),
            self.with_rid(format!("{}/start", self.url)),
            self.log.clone(),
        );
        self.start = std::thread::Builder::new()
            .name("ping".into())
            .stack_size(256 * 1024)
            .spawn(move || send(&agent, &url, &log, "start", None))
            .ok();
    }

    /// `URL` for status 0, `URL/N` otherwise, after the start ping (if any) is done.
    pub fn finished(mut self, status: u8, body: Option<Vec<u8>>) {
        if let Some(start) = self.start.take() {
            // Bounded: the start ping gives up after two attempts.
            let _ = start.join();
        }
        let url = if status == 0 {
            self.url.clone()
        } else {
            format!("{}/{status}", self.url)
        };
        let url = self.with_rid(url);
        send(&self.agent, &url, &self.log, "exit status", body.as_deref());
    }
}

impl Pinger {
    /// `url` with `rid=` once the run has an id (a run that never started has none).
    fn with_rid(&self, url: String) -> String {
        match &self.rid {
            Some(rid) if url.contains('?') => format!("{url}&rid={rid}"),
            Some(rid) => format!("{url}?rid={rid}"),
            None => url,
        }
    }
}

fn agent(https: bool) -> ureq::Agent {
    let mut tls = ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()));
    if https {
        tls = tls.root_certs(roots());
    }
    ureq::Agent::config_builder()
        .timeout_global(Some(ATTEMPT))
        .tls_config(tls.build())
        .build()
        .new_agent()
}

/// The system's CA store where there is one, else the bundled Mozilla roots.
fn roots() -> ureq::tls::RootCerts {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        return ureq::tls::RootCerts::WebPki;
    }
    let certs = found
        .certs
        .into_iter()
        .map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
        .collect();
    ureq::tls::RootCerts::Specific(Arc::new(certs))
}

/// What went wrong, in words that cannot contain the URL.
fn reason(e: &ureq::Error) -> String {
    match e {
        ureq::Error::StatusCode(code) => format!("the server answered HTTP {code}"),
        ureq::Error::Timeout(_) => format!("no answer within {}s", ATTEMPT.as_secs()),
        ureq::Error::Io(io) => crate::log::io_text(io),
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::Tls(_) | ureq::Error::Rustls(_) => "TLS failed".into(),
        _ => "request failed".into(),
    }
}

/// One ping, retried once; a failure is a warning, never an error.
fn send(agent: &OnceLock<ureq::Agent>, url: &str, log: &Log, what: &str, body: Option<&[u8]>) {
    let agent = agent.get_or_init(|| self::agent(url.starts_with("https://")));
    let mut last = String::new();
    for attempt in 0..2 {
        if attempt > 0 {
            std::thread::sleep(RETRY_AFTER);
        }
        let sent = match body {
            Some(b) => agent.post(url).send(b),
            None => agent.post(url).send_empty(),
        };
        match sent {
            Ok(_) => return,
            Err(e) => last = reason(&e),
        }
    }
    log.event(
        Level::Warn,
        "ping_failed",
        &format!("ping ({what}) failed: {last}; the job's status is unchanged"),
        &[("ping", what.into())],
    );
}
