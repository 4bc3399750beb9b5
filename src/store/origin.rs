//! What a [`crate::store::topology::Redis`] was resolved from: what crosses to another process in
//! its place (a crontab job's run, sent to the replica's starter), and is resolved again there.
//! Equal ones are shared within a process.

use std::sync::Arc;
use std::time::Duration;

use crate::store::tls::TlsOptions;

/// What a `Redis` was resolved from. Its URL may hold a password: it is never shown (no
/// `Debug`), and crosses only the replica's link to its starter.
#[derive(PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Origin {
    pub url: String,
    /// The flag or variable the URL came from, for messages.
    pub source: String,
    pub connect_timeout: Duration,
    pub tls: TlsOptions,
    pub min_replicas: u32,
}

/// The most distinct origins kept for sharing.
const SHARED_MAX: usize = 1024;

/// `origin`, shared with every equal one resolved before in this process: a replica's
/// thousands of jobs mostly name the same server, and each would otherwise keep a copy.
pub fn shared(origin: Origin, fingerprint: u64) -> Arc<Origin> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static SHARED: Mutex<Option<HashMap<u64, Arc<Origin>>>> = Mutex::new(None);
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let map = shared.get_or_insert_with(HashMap::new);
    match map.get(&fingerprint) {
        // The same fingerprint is almost surely the same origin; compared to be sure.
        Some(kept) if **kept == origin => kept.clone(),
        Some(_) => Arc::new(origin),
        None => {
            let origin = Arc::new(origin);
            if map.len() < SHARED_MAX {
                map.insert(fingerprint, origin.clone());
            }
            origin
        }
    }
}
