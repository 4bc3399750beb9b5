//! Facts about this host that identify a lock holder: its name and who runs us.

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
