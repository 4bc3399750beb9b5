//! Shapes written by the scripts and by earlier versions read whole through their types.

use serde_json::Value;

use super::holder::HolderValue;
use super::ledger::LedgerEntry;
use super::run::{Ending, RecordedEnding, RunRecord};
use super::suspension::Suspension;
use super::Stored;

fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(raw: &str, shown: &str) {
    let stored = Stored::<T>::read(raw);
    assert!(stored.ours().is_some(), "{raw}");
    let want: Value = serde_json::from_str(shown).unwrap();
    assert_eq!(stored.to_json(), want, "{raw}");
}

#[test]
fn ledger_entries_of_every_shape_read_whole() {
    for raw in [
        r#"{"attempts":[{"host":"h","run_id":"r","fence":"17","started":1,"state":"running"}],"holder":"{\"token\":\"r\"}","state":"running"}"#,
        r#"{"attempts":[{"ended":2,"exit":0,"fence":17,"host":"h","run_id":"r","started":1,"state":"succeeded"}],"state":"succeeded"}"#,
        r#"{"attempts":[{"host":"h","new_field":[1],"state":"abandoned"}],"state":"abandoned","later":true}"#,
        r#"{"state":"missed","reason":"no_room","attempts":[]}"#,
        // --overlap replace: replaced, then ended by its run's release.
        r#"{"attempts":[{"ended":9,"exit":122,"fence":"17","host":"h","replaced":5,"run_id":"r","started":1,"state":"replaced"}],"holder":"{\"token\":\"r\"}","state":"replaced"}"#,
    ] {
        round_trip::<LedgerEntry>(raw, raw);
    }
    // Lua's cjson writes an empty list as {}.
    round_trip::<LedgerEntry>(
        r#"{"state":"skipped","reason":"overlap","attempts":{}}"#,
        r#"{"state":"skipped","reason":"overlap","attempts":[]}"#,
    );
    let foreign = Stored::<LedgerEntry>::read("not json");
    assert_eq!(foreign, Stored::Foreign("not json".into()));
    assert_eq!(foreign.to_json(), serde_json::json!({"value": "not json"}));
}

#[test]
fn run_records_keep_endings_this_version_does_not_know() {
    let raw = r#"{"command":"true","duration_ms":5,"ended":"exited","exit_status":0,"fencing_token":3,"finished":9,"host":"h","key":"k","pid":1,"started":4,"token":"t"}"#;
    round_trip::<RunRecord>(raw, raw);
    let rec = Stored::<RunRecord>::read(raw);
    assert_eq!(
        rec.ours().unwrap().ended,
        Some(RecordedEnding::Known(Ending::Exited))
    );
    let later = r#"{"ended":"vanished","host":"h"}"#;
    round_trip::<RunRecord>(later, later);
    let rec = Stored::<RunRecord>::read(later);
    assert_eq!(
        rec.ours().unwrap().ended,
        Some(RecordedEnding::Other("vanished".into()))
    );
}

#[test]
fn holders_and_suspensions_read_whole_and_foreign_values_stay_foreign() {
    let holder = r#"{"command":"x","host":"h","pid":42,"started":1,"token":"t"}"#;
    round_trip::<HolderValue>(holder, holder);
    let suspension = r#"{"host":"h","reason":"db move","since":1795740000000,"user":"ops"}"#;
    round_trip::<Suspension>(suspension, suspension);
    // A field of the wrong type is not ours: shown as the value it is.
    let odd = Stored::<HolderValue>::read(r#"{"pid":"forty-two"}"#);
    assert!(odd.ours().is_none());
}
