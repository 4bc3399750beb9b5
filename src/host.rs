//! Facts about this host that identify a lock holder: host name and wall-clock time.

use std::time::{SystemTime, UNIX_EPOCH};

/// The host name from `gethostname(2)`, or `unknown`; read once.
pub fn hostname() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(read_hostname).clone()
}

fn read_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates when it fits.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Wall-clock milliseconds since the Unix epoch, for records people read (never for deadlines).
pub fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// RFC 3339 rendering of [`unix_millis`] values for humans.
pub fn rfc3339(ms: u64) -> String {
    let t = UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Who runs us, for records people read (`--suspend`): `$USER` or `$LOGNAME`, else `uid N`.
pub fn user() -> String {
    use std::os::unix::fs::MetadataExt;
    ["USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|u| !u.is_empty())
        .or_else(|| {
            std::fs::metadata("/proc/self")
                .ok()
                .map(|m| format!("uid {}", m.uid()))
        })
        .unwrap_or_else(|| "unknown".into())
}
