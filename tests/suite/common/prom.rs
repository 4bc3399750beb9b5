//! Prometheus's own tools on what cronlock exposes: the samples of a text (metrics files,
//! `/metrics`), prometheus_client's parser, and `promtool test rules` on the shipped alerting
//! rules with series taken from such texts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

pub const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/monitoring/cronlock.rules.yml"
);

/// The samples of a text: (name, `name{labels}`, value).
pub fn samples(text: &str) -> Vec<(String, String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            let name = series.split('{').next().unwrap().to_string();
            (name, series.to_string(), value.parse().unwrap())
        })
        .collect()
}

pub fn promtool(args: &[&str]) -> std::process::Output {
    Command::new("promtool").args(args).output().expect(
        "promtool is required (Debian: apt-get install prometheus; scripts/test.sh installs it)",
    )
}

/// Parse a text with prometheus_client's parser: {"name{labels}": value}; every family has a
/// help text, and a type among `types`.
pub fn parse(path: &Path, types: &str) -> serde_json::Value {
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
types = sys.argv[2].split(",")
for fam in text_string_to_metric_families(open(sys.argv[1]).read()):
    assert fam.type in types, fam
    assert fam.documentation, fam
    for s in fam.samples:
        labels = ",".join(f'{k}={v}' for k, v in sorted(s.labels.items()))
        out[f"{s.name}{{{labels}}}"] = s.value
print(json.dumps(out))
"#;
    let out = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(path)
        .arg(types)
        .output()
        .expect("/usr/bin/python3 with python3-prometheus-client (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// An alert as promtool expects it: its labels and annotations, as YAML flow text.
pub type Expected = (String, String);

/// Run `promtool test rules` on the shipped rules with `all` (constant for over 28 hours, every
/// timestamp rebased so that the earliest is promtool's 60 s) and, per alert, what it should say
/// 10 minutes and 27 hours in. The test file is written in `dir`.
pub fn rules_test(
    dir: &Path,
    all: &[(String, String, f64)],
    alerts: &BTreeMap<&str, [Vec<Expected>; 2]>,
) {
    // (0 is "never": it stays 0.)
    let base = all
        .iter()
        .filter(|(n, _, v)| n.ends_with("_timestamp_seconds") && *v > 0.0)
        .map(|(_, _, v)| *v)
        .fold(f64::MAX, f64::min)
        .floor()
        - 60.0;
    let mut test = String::new();
    writeln!(
        test,
        "rule_files:\n  - {RULES}\nevaluation_interval: 1m\ntests:"
    )
    .unwrap();
    writeln!(test, "  - interval: 1m\n    input_series:").unwrap();
    for (name, series, value) in all {
        let v = if name.ends_with("_timestamp_seconds") && *value > 0.0 {
            value - base
        } else {
            *value
        };
        writeln!(
            test,
            "      - series: '{series}'\n        values: '{v}+0x1700'"
        )
        .unwrap();
    }
    writeln!(test, "    alert_rule_test:").unwrap();
    for (name, at) in alerts {
        for (eval, expected) in ["10m", "27h"].iter().zip(at) {
            writeln!(
                test,
                "      - eval_time: {eval}\n        alertname: {name}\n        exp_alerts:"
            )
            .unwrap();
            if expected.is_empty() {
                // promtool's way to say "none": an empty list.
                test.truncate(test.len() - 1);
                writeln!(test, " []").unwrap();
            }
            for (labels, annotations) in expected {
                writeln!(
                    test,
                    "          - exp_labels: {{ {labels} }}\n            exp_annotations: {{ {annotations} }}"
                )
                .unwrap();
            }
        }
    }
    let file = dir.join("cronlock.rules.test.yml");
    std::fs::write(&file, &test).unwrap();
    let out = promtool(&["test", "rules", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}\n--- {}:\n{test}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        file.display()
    );
}

/// What CronlockNoRecentSuccess says of KEY.
pub fn no_success(key: &str) -> Expected {
    (
        format!("key: {key}, severity: page"),
        format!(
            "summary: '{key} has not succeeded on any host for 26h', description: 'cronlock \
             --status --history {key} shows its recent instants and attempts.'"
        ),
    )
}

/// What CronlockNoSuccessInTwoPeriods says of KEY.
pub fn no_success_in_two_periods(key: &str) -> Expected {
    (
        format!("key: {key}, severity: page"),
        format!(
            "summary: '{key} has not succeeded for two of its periods', description: 'cronlock \
             --status {key} shows its ledger: which instants ran, failed or were missed, and why.'"
        ),
    )
}

/// What CronlockSuspendedTooLong says of KEY.
pub fn suspended(key: &str) -> Expected {
    (
        format!("key: {key}, severity: warning"),
        format!(
            "summary: '{key} has been suspended for more than a day', description: 'cronlock \
             --status {key} says who suspended it and why; cronlock --resume {key} ends it.'"
        ),
    )
}
