//! Every record a Lua script or cronlock writes to Redis reads back whole through its one Rust
//! type (`cronlock::record`): the ledger in each state it can reach (a first attempt ended as
//! text, a later one and an abandoned one through cjson, missed, skipped), the run record and its
//! history, the suspension, and the holder value. Read and shown again, nothing is lost.

use std::time::Duration;

use cronlock::record::holder::HolderValue;
use cronlock::record::ledger::LedgerEntry;
use cronlock::record::run::RunRecord;
use cronlock::record::suspension::Suspension;
use cronlock::record::Stored;
use cronlock::store::keys::Keys;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::common::*;

/// `raw` reads as a record cronlock wrote, and shows again as the same JSON (an empty list that
/// Lua's cjson wrote as `{}` shows as `[]`).
fn reads_whole<T: DeserializeOwned + Serialize>(what: &str, raw: &str) {
    let stored = Stored::<T>::read(raw);
    assert!(stored.ours().is_some(), "{what} reads as foreign: {raw}");
    let mut want: Value = serde_json::from_str(raw).unwrap();
    if want["attempts"] == serde_json::json!({}) {
        want["attempts"] = serde_json::json!([]);
    }
    assert_eq!(stored.to_json(), want, "{what}: {raw}");
}

fn keys(name: &str) -> Keys {
    Keys::new("cronlock:", name)
}

/// Every entry of KEY's ledger, read whole; their states.
fn ledger_states(r: &Redis, name: &str) -> Vec<String> {
    let entries: Vec<(String, String)> = r.query(redis::cmd("HGETALL").arg(keys(name).ledger));
    let mut states = Vec::new();
    for (at, raw) in entries {
        reads_whole::<LedgerEntry>(&format!("{name} ledger {at}"), &raw);
        let entry: Stored<LedgerEntry> = Stored::read(&raw);
        states.push(entry.ours().unwrap().state.clone().unwrap_or_default());
    }
    states
}

#[test]
fn every_stored_record_reads_back_whole() {
    let r = Redis::start();
    let each = ["--schedule", "* * * * * *", "--history", "5"];
    // Succeeded (a first attempt ended as text), kept for --min-hold: its holder value stays.
    let out = run(cronlock(&r)
        .args(each)
        .args(["--min-hold", "60s", "ok", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Failed, then a later attempt at the same instant (written through cjson).
    for _ in 0..2 {
        let out = run(cronlock(&r).args([
            "--schedule",
            "*/30 * * * * *",
            "--catch-up",
            "60s",
            "--retries",
            "2",
            "--history",
            "5",
            "bad",
            "false",
        ]));
        assert_eq!(code(&out), 1, "{}", stderr(&out));
    }
    // Skipped while suspended.
    let out = run(cronlock(&r).args(["--suspend", "sus", "--reason", "db move"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    run(cronlock(&r).args(each).args(["sus", "true"]));
    // Missed: the instants a --catch-up window passed over.
    let out = run(cronlock(&r)
        .args(each)
        .args(["--catch-up", "10s", "miss", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let first = std::time::Instant::now();
    assert!(wait_for(Duration::from_secs(5), || first.elapsed()
        >= Duration::from_millis(2500)));
    let out = run(cronlock(&r)
        .args(each)
        .args(["--catch-up", "10s", "miss", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Abandoned: a run SIGKILLed (its guard stops the command), its lock left to lapse; the next
    // claim ends its entry through cjson.
    let dir = scratch("records-abandoned");
    let mut killed = cronlock(&r)
        .args(each)
        .args(["--ttl", "1s", "ab", "sh", "-c"])
        .arg(format!("echo $$ > {}/pid; exec sleep 30", dir.display()))
        .spawn()
        .unwrap();
    let pid = read_pid(&dir.join("pid"));
    signal(killed.id() as i32, libc::SIGKILL);
    let _ = killed.wait();
    assert!(wait_for(Duration::from_secs(5), || !alive(pid)));
    assert!(wait_for(Duration::from_secs(5), || !r.exists(&keys("ab").lock)));
    assert!(wait_for(Duration::from_secs(5), || {
        let out = run(cronlock(&r).args(each).args(["ab", "true"]));
        code(&out) == 0
    }));

    let mut states = Vec::new();
    for name in ["ok", "bad", "sus", "miss", "ab"] {
        states.extend(ledger_states(&r, name));
        let k = keys(name);
        if let Some(raw) = r.get(&k.last) {
            reads_whole::<RunRecord>(&format!("{name} last run"), &raw);
        }
        let history: Vec<String> = r.query(redis::cmd("LRANGE").arg(&k.history).arg(0).arg(-1));
        for raw in history {
            reads_whole::<RunRecord>(&format!("{name} history"), &raw);
        }
    }
    for state in ["succeeded", "failed", "skipped", "missed", "abandoned"] {
        assert!(states.iter().any(|s| s == state), "no {state}: {states:?}");
    }
    let bad: Vec<(String, String)> = r.query(redis::cmd("HGETALL").arg(keys("bad").ledger));
    assert!(
        bad.iter()
            .any(|(_, raw)| raw.matches("\"run_id\"").count() == 2),
        "no entry with two attempts: {bad:?}"
    );
    let suspension: String = r.query(redis::cmd("HGET").arg(keys("sus").suspend).arg("current"));
    reads_whole::<Suspension>("suspension", &suspension);
    let holder = r.get(&keys("ok").lock).expect("kept for --min-hold");
    reads_whole::<HolderValue>("holder", &holder);
}
