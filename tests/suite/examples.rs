//! The `--crontab` deployments in `examples/` (a Kubernetes Deployment with its ConfigMap, a
//! Compose file, a systemd unit): their crontabs are read by the real binary, and the time each
//! platform gives a stopping replica covers `--drain` and `--grace`.

use std::path::Path;
use std::time::Duration;

use crate::common::replicas::{replica, replica_err, stop};
use crate::common::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap()
}

/// The block under `key: |` in a YAML text, dedented.
fn literal_block(yaml: &str, key: &str) -> String {
    let mut lines = yaml.lines().skip_while(|l| l.trim() != format!("{key}: |"));
    let head = lines.next().expect("the block");
    let indent = head.len() - head.trim_start().len();
    let body: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
        .collect();
    let cut = body
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    body.iter()
        .map(|l| l.get(cut..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A replica reads `text` as its crontab, serves its jobs (N of them), and stops on SIGTERM.
fn serves(r: &Redis, name: &str, text: &str, jobs: usize) {
    let dir = scratch(name);
    let file = dir.join("crontab");
    std::fs::write(&file, text).unwrap();
    let c = replica(&r.url(), &file, &[]);
    let want = format!("serving {jobs} jobs");
    assert!(
        wait_for(Duration::from_secs(10), || replica_err(&file)
            .contains(&want)),
        "{name}: {}",
        replica_err(&file)
    );
    assert_eq!(stop(c), Some(0), "{name}: {}", replica_err(&file));
}

/// Seconds in a value such as `40s` or `40`.
fn seconds(text: &str) -> u64 {
    text.trim().trim_end_matches('s').parse().unwrap()
}

/// The value after `key` on the first line that has it.
fn value_of<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key}"))
        .trim()
}

/// --drain (25 s) plus --grace (5 s), and a little for the release.
const STOP_NEEDS: u64 = 32;

#[test]
fn the_kubernetes_deployment_serves_its_configmap() {
    let r = Redis::start();
    let yaml = read("examples/kubernetes/deployment.yaml");
    serves(&r, "k8s", &literal_block(&yaml, "crontab"), 3);
    assert!(yaml.contains("\"--crontab\", \"/etc/cronlock/crontab\""));
    assert!(yaml.contains("mountPath: /etc/cronlock,"));
    // Mounted so that only its owner (root) can change it, or the replicas refuse it.
    assert!(yaml.contains("configMap: { name: cronlock-crontab, defaultMode: 0644 }"));
    assert!(yaml.contains("replicas: 3"));
    assert!(seconds(value_of(&yaml, "terminationGracePeriodSeconds:")) >= STOP_NEEDS);
}

#[test]
fn the_compose_file_and_the_systemd_unit_give_a_drain_its_time() {
    let r = Redis::start();
    serves(&r, "compose", &read("examples/compose/crontab"), 2);
    let compose = read("examples/compose/compose.yaml");
    assert!(compose.contains("./crontab:/etc/cronlock/crontab:ro"));
    assert!(seconds(value_of(&compose, "stop_grace_period:")) >= STOP_NEEDS);
    let unit = read("examples/systemd/cronlock-crontab.service");
    assert!(value_of(&unit, "ExecStart=").contains("--crontab /etc/cronlock/crontab"));
    assert!(seconds(value_of(&unit, "TimeoutStopSec=")) >= STOP_NEEDS);
    assert_eq!(value_of(&unit, "KillMode="), "mixed");
}

#[test]
fn the_examples_watch_each_replica_on_its_listen_port() {
    // Kubernetes: the probes and the scrape annotations name the port --listen serves.
    let yaml = read("examples/kubernetes/deployment.yaml");
    assert!(yaml.contains("\"--listen\", \":9746\""));
    assert!(yaml.contains("- { name: http, containerPort: 9746 }"));
    assert!(yaml.contains("httpGet: { path: /healthz, port: http }"));
    assert!(yaml.contains("httpGet: { path: /readyz, port: http }"));
    assert!(yaml.contains("prometheus.io/port: \"9746\""));
    let unit = read("examples/systemd/cronlock-crontab.service");
    assert!(value_of(&unit, "ExecStart=").ends_with("--listen 127.0.0.1:9746"));
    // Compose: its healthcheck, run as the container would (port changed), against a replica.
    let compose = read("examples/compose/compose.yaml");
    assert!(compose.contains("\"--listen\", \":9746\""));
    let test = value_of(&compose, "test:");
    let script: Vec<String> = serde_json::from_str(test).unwrap();
    assert_eq!(&script[..3], ["CMD", "bash", "-c"]);
    let r = Redis::start();
    let dir = scratch("compose-health");
    let file = dir.join("crontab");
    std::fs::write(&file, read("examples/compose/crontab")).unwrap();
    let port = free_port();
    let probe = || {
        std::process::Command::new("bash")
            .arg("-c")
            .arg(script[3].replace("9746", &port.to_string()))
            .status()
            .unwrap()
            .success()
    };
    assert!(!probe(), "the healthcheck passed with nothing listening");
    let c = replica(&r.url(), &file, &["--listen", &format!("127.0.0.1:{port}")]);
    assert!(wait_for(Duration::from_secs(10), probe));
    assert_eq!(stop(c), Some(0));
}

/// The fenced blocks of a Markdown text: (line of the fence, info string, body).
fn fenced(text: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String, Vec<&str>)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => open = Some((i + 1, info.trim().to_string(), Vec::new())),
            (Some(_), Some(_)) => {
                let (at, info, body) = open.take().unwrap();
                out.push((at, info, body.join("\n") + "\n"));
            }
            (Some((_, _, body)), None) => body.push(line),
            (None, None) => {}
        }
    }
    out
}

/// A block that reads as a `--crontab` file: every line a comment, a `NAME=value` or a job
/// (a schedule, then no `cronlock` on the line: a plain crontab's lines call cronlock).
fn looks_like_a_replicas_crontab(body: &str) -> bool {
    let jobs: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter(|l| {
            !l.split_once('=')
                .is_some_and(|(n, _)| n.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        })
        .collect();
    let scheduled = |l: &&str| {
        let first = l.split_whitespace().next().unwrap_or("");
        first.starts_with('@')
            || (l.split_whitespace().count() > 5
                && l.split_whitespace().take(5).all(|f| {
                    f.chars().all(|c| {
                        c.is_ascii_digit() || "*/,-H".contains(c) || c.is_ascii_alphabetic()
                    })
                })
                && first
                    .chars()
                    .any(|c| c.is_ascii_digit() || c == '*' || c == 'H'))
    };
    !jobs.is_empty() && jobs.iter().all(scheduled) && !jobs.iter().any(|l| l.contains("cronlock"))
}

/// Every `--crontab` file the README and docs/ show (a block fenced as `crontab`) is read by
/// `cronlock --crontab FILE --test` as pasted: every line valid. A block that reads as one but
/// is not fenced so fails too, so none escapes the check.
#[test]
fn every_crontab_block_of_the_docs_passes_the_crontab_test() {
    let mut docs = vec![Path::new(ROOT).join("README.md")];
    let mut more: Vec<_> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    let dir = scratch("docs-crontabs");
    let mut tested = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for (line, info, body) in fenced(&text) {
            let at = format!("{}:{line}", doc.display());
            if info != "crontab" {
                assert!(
                    !looks_like_a_replicas_crontab(&body),
                    "{at}: a --crontab file not fenced as crontab:\n{body}"
                );
                continue;
            }
            // The check below would catch this block were it not fenced so.
            assert!(looks_like_a_replicas_crontab(&body), "{at}");
            let file = dir.join(format!("crontab-{tested}"));
            std::fs::write(&file, &body).unwrap();
            let out = run(cronlock_at("redis://127.0.0.1:1")
                .arg("--crontab")
                .arg(&file)
                .arg("--test"));
            assert_eq!(code(&out), 0, "{at}: {}", stderr(&out));
            assert!(stdout(&out).contains("every line valid"), "{at}");
            tested += 1;
        }
    }
    // README's two and docs/fleet.md's.
    assert!(tested >= 3, "{tested}");
}
