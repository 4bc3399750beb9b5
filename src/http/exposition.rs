//! `GET /metrics`: the Prometheus text format. Per job, the series a `--metrics-dir` file of it
//! holds, under the same names and labels (so the shipped alerting rules work on them unchanged),
//! then its next instant, its attempts here by outcome, and, read from Redis for this scrape,
//! whether it is suspended and its ledger's instants by state; per replica, its jobs, runs,
//! `--max-jobs`, claims, whether it drains, its calls to Redis and its version.

use crate::record::ledger::MissedReason;
use std::collections::HashMap;
use std::fmt::Write as _;

use crate::clock::unix_millis;
use crate::fleet::metrics::OUTCOMES;
use crate::host::hostname;
use crate::record::ledger::STATES;

use super::answer::Response;
use super::board::{Board, BoardState, Fleetwide, RTT_BOUNDS};
use super::fleet::Reader;

/// One metric family: its help, type and samples.
#[derive(Default)]
struct Family {
    help: String,
    kind: String,
    samples: Vec<String>,
}

/// Families in order of first appearance.
#[derive(Default)]
struct Families {
    order: Vec<String>,
    each: HashMap<String, Family>,
}

impl Families {
    fn family(&mut self, name: &str) -> &mut Family {
        if !self.each.contains_key(name) {
            self.order.push(name.to_string());
        }
        self.each.entry(name.to_string()).or_default()
    }

    /// One sample of `name` (a gauge unless said), with its help the first time.
    fn add(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        labels: &str,
        value: impl std::fmt::Display,
    ) {
        let f = self.family(name);
        if f.help.is_empty() {
            f.help = help.to_string();
            f.kind = kind.to_string();
        }
        if labels.is_empty() {
            f.samples.push(format!("{name} {value}"));
        } else {
            f.samples.push(format!("{name}{{{labels}}} {value}"));
        }
    }

    /// The lines of a metrics file's text, put with their families.
    fn absorb(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                let f = self.family(name);
                if f.help.is_empty() {
                    f.help = help.to_string();
                }
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap_or((rest, "gauge"));
                self.family(name).kind = kind.to_string();
            } else if !line.is_empty() {
                let name = line.split(['{', ' ']).next().unwrap_or_default();
                self.family(name).samples.push(line.to_string());
            }
        }
    }

    fn text(&self) -> String {
        let mut out = String::new();
        for name in &self.order {
            let Family {
                help,
                kind,
                samples,
            } = &self.each[name];
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(
                out,
                "# TYPE {name} {}",
                if kind.is_empty() { "gauge" } else { kind }
            );
            for s in samples {
                let _ = writeln!(out, "{s}");
            }
        }
        out
    }
}

/// A label value escaped for the text format.
fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
}

pub fn answer(board: &Board, fleet: &mut Reader) -> Response {
    let jobs = board.state().jobs.clone();
    let read = fleet.read(&jobs).by_key;
    let mut f = Families::default();
    let host = hostname();
    let now = unix_millis() as i64;
    {
        let s = board.state();
        for job in &jobs {
            if let Some(text) = s.files.get(&job.key) {
                f.absorb(text);
            }
        }
        for job in &jobs {
            let key = format!("key=\"{}\"", escape(&job.key));
            if let Some(next) = job.schedule.next_after(now) {
                f.add(
                    "cronlock_next_instant_timestamp_seconds",
                    "gauge",
                    "The job's next scheduled instant (Unix time).",
                    &key,
                    next / 1000,
                );
                if let Some(after) = job.schedule.next_after(next) {
                    f.add(
                        "cronlock_schedule_period_seconds",
                        "gauge",
                        "The time between the job's next two instants.",
                        &key,
                        (after - next) / 1000,
                    );
                }
            }
            f.add(
                "cronlock_replica_serving_since_timestamp_seconds",
                "gauge",
                "When this replica began to serve the job (Unix time).",
                &key,
                job.since_ms / 1000,
            );
            let counts = s.outcomes.get(&job.key).copied().unwrap_or_default();
            for (o, n) in OUTCOMES.iter().zip(counts) {
                f.add(
                    "cronlock_attempts_total",
                    "counter",
                    "The job's attempts on this replica since it started, by outcome.",
                    &format!("{key},host=\"{}\",outcome=\"{}\"", escape(&host), o.name()),
                    n,
                );
            }
        }
    }
    for job in &jobs {
        if let Some(state) = read.get(&job.key) {
            fleet_series(&mut f, &job.key, state);
        }
    }
    replica_series(board, &mut f, jobs.len());
    Response {
        status: 200,
        kind: "text/plain; version=0.0.4; charset=utf-8",
        body: f.text(),
    }
}

/// The job's fleet-wide series, from what was read of Redis for this scrape.
fn fleet_series(f: &mut Families, job: &str, state: &Fleetwide) {
    let key = format!("key=\"{}\"", escape(job));
    f.add(
        "cronlock_fleet_suspended",
        "gauge",
        "1 while the job is suspended (cronlock --suspend), read from Redis, else 0.",
        &key,
        u8::from(state.suspended.is_some()),
    );
    if let Some(until) = state.suspended.as_ref().and_then(|s| s.ours()?.until) {
        f.add(
            "cronlock_fleet_suspended_until_timestamp_seconds",
            "gauge",
            "With cronlock --suspend --for: when the suspension ends by itself (Unix time).",
            &key,
            until / 1000,
        );
    }
    f.add(
        "cronlock_fleet_last_success_timestamp_seconds",
        "gauge",
        "When a run of the job last succeeded on any host (Unix time), read from Redis; 0 \
         when none is recorded.",
        &key,
        state.last_success.unwrap_or(0) / 1000,
    );
    let states: Vec<String> = state
        .ledger
        .iter()
        .map(|l| {
            l.entry
                .ours()
                .and_then(|e| e.state.clone())
                .unwrap_or_default()
        })
        .collect();
    let manual: Vec<bool> = state
        .ledger
        .iter()
        .map(|l| l.entry.ours().is_some_and(|e| e.manual))
        .collect();
    for st in STATES {
        let n = states.iter().filter(|s| *s == st).count();
        f.add(
            "cronlock_ledger_instants",
            "gauge",
            "The job's newest instants in the ledger (up to 64), by state, read from Redis.",
            &format!("{key},state=\"{st}\""),
            n,
        );
        let m = states
            .iter()
            .zip(&manual)
            .filter(|(s, m)| *s == st && **m)
            .count();
        f.add(
            "cronlock_ledger_manual_instants",
            "gauge",
            "Of those, the manual ones (cronlock --trigger), by state.",
            &format!("{key},state=\"{st}\""),
            m,
        );
    }
}

/// The replica's own series.
fn replica_series(board: &Board, f: &mut Families, jobs: usize) {
    let s = board.state();
    let gauges = [
        (
            "cronlock_replica_jobs",
            "The jobs of this replica's crontab.",
            jobs as u64,
        ),
        (
            "cronlock_replica_runs",
            "The runs this replica supervises now.",
            s.running.len() as u64,
        ),
        (
            "cronlock_replica_claims_in_flight",
            "Claims sent and not yet answered.",
            s.in_flight as u64,
        ),
        (
            "cronlock_replica_max_jobs",
            "--max-jobs: the most runs at once.",
            u64::from(s.max_jobs),
        ),
        (
            "cronlock_replica_draining",
            "1 once asked to stop (claiming nothing more), else 0.",
            u64::from(s.draining),
        ),
    ];
    for (name, help, v) in gauges {
        f.add(name, "gauge", help, "", v);
    }
    for (result, n) in [("won", s.claims_won), ("lost", s.claims_lost)] {
        f.add(
            "cronlock_replica_claims_total",
            "counter",
            "Claims this replica made, by result (lost: another replica ran the instant, or it was not due).",
            &format!("result=\"{result}\""),
            n,
        );
    }
    // Every job and reason from the first scrape (an alert on increase() needs the zero).
    for job in &s.jobs {
        for reason in MissedReason::ALL {
            let n = s.missed.get(&(job.key.clone(), reason)).copied();
            f.add(
                "cronlock_instants_missed_total",
                "counter",
                "Instants of the job this replica recorded missed in the ledger, by reason (no_room: no replica had room in time; redis_unreachable: claims could not reach Redis; late: the replica came to them only after they could no longer start; reload: they waited on a replica whose crontab changed or removed their job).",
                &format!("key=\"{}\",reason=\"{}\"", escape(&job.key), reason.name()),
                n.unwrap_or(0),
            );
        }
    }
    if let Some(ms) = s.clock_offset_ms {
        f.add(
            "cronlock_replica_clock_offset_seconds",
            "gauge",
            "How far Redis's clock is ahead of this host's (negative: behind), as the heartbeats measured it; instants are named and claimed by Redis's clock.",
            "",
            ms as f64 / 1000.0,
        );
    }
    rtt_histogram(&s, f);
    f.add(
        "cronlock_redis_errors_total",
        "counter",
        "This replica's calls to Redis that failed.",
        "",
        s.redis_errors,
    );
    f.add(
        "cronlock_build_info",
        "gauge",
        "cronlock's version, as a label; always 1.",
        &format!("version=\"{}\"", env!("CARGO_PKG_VERSION")),
        1,
    );
}

/// The round-trip times of the replica's calls to Redis, as a histogram.
fn rtt_histogram(s: &BoardState, f: &mut Families) {
    let name = "cronlock_redis_request_duration_seconds";
    let help = "How long this replica's calls to Redis took (claims, releases, heartbeats).";
    let mut total = 0;
    for (i, n) in s.rtt.iter().enumerate() {
        total += n;
        let le = RTT_BOUNDS
            .get(i)
            .map_or("+Inf".to_string(), |b| b.to_string());
        f.add(name, "histogram", help, &format!("le=\"{le}\""), total);
    }
    let fam = f.family(name);
    fam.samples
        .iter_mut()
        .for_each(|l| *l = l.replacen(name, &format!("{name}_bucket"), 1));
    fam.samples.push(format!("{name}_sum {:.6}", s.rtt_sum));
    fam.samples.push(format!("{name}_count {total}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_of_many_jobs_make_one_family_per_name() {
        let mut f = Families::default();
        for key in ["a", "b"] {
            f.absorb(&format!(
                "# HELP x_total The x.\n# TYPE x_total gauge\nx_total{{key=\"{key}\"}} 1\n\
                 # HELP y The y.\n# TYPE y gauge\ny{{key=\"{key}\"}} 2\n"
            ));
        }
        f.add("z", "counter", "The z.", "", 3);
        let text = f.text();
        assert_eq!(text.matches("# HELP x_total").count(), 1, "{text}");
        assert_eq!(text.matches("# TYPE y gauge").count(), 1, "{text}");
        let x = text.find("x_total{key=\"a\"}").unwrap();
        let y = text.find("# HELP y").unwrap();
        assert!(x < text.find("x_total{key=\"b\"}").unwrap());
        assert!(text.find("x_total{key=\"b\"}").unwrap() < y, "{text}");
        assert!(
            text.ends_with("# HELP z The z.\n# TYPE z counter\nz 3\n"),
            "{text}"
        );
        assert_eq!(escape("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
    }
}
