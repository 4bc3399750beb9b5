//! Files that decide what cronlock runs or where it connects (a crontab, a file holding the Redis
//! or ping URL) must be changeable only by their owner, and that owner must be the user cronlock
//! runs as or root: otherwise whoever else can write the file runs commands as cronlock's user, or
//! points it at a server of theirs. cron refuses such files the same way (cronie: "WRONG FILE
//! OWNER", "BAD FILE MODE"); `crontab(1)` installs user crontabs 0600.
//!
//! The check is made on the file as opened (after symlinks, so a Kubernetes ConfigMap's `..data`
//! links are followed to the file itself), with `fstat`, so the file checked is the file read.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Why `path` (opened, `meta` its `fstat`) may not be trusted, in words that follow its name
/// ("owned by ...", "writable by ..."), naming its owner and mode and what to run; `None` when it
/// may. `harm` says what a stranger could do with it.
pub fn untrusted(path: &Path, meta: &Metadata, harm: &str) -> Option<String> {
    let me = nix::unistd::geteuid().as_raw();
    let (uid, mode) = (meta.uid(), meta.mode() & 0o7777);
    let foreign = uid != me && uid != 0;
    let writable = mode & 0o022 != 0;
    if !foreign && !writable {
        return None;
    }
    let shown = path.display();
    let owner = user_name(uid).map_or(format!("uid {uid}"), |n| format!("{n} (uid {uid})"));
    let whose = if me == 0 {
        "root's".to_string()
    } else {
        let name = user_name(me).unwrap_or_else(|| format!("uid {me}"));
        format!("this user's ({name}) or root's")
    };
    let (what, fix) = match (foreign, writable) {
        (true, true) => (
            format!("owned by {owner} and writable by its group or others (mode {mode:04o})"),
            format!("chown {} {shown} && chmod go-w {shown}", chown_to(me)),
        ),
        (true, false) => (
            format!("owned by {owner} (mode {mode:04o}), not {whose}"),
            format!("chown {} {shown}", chown_to(me)),
        ),
        _ => (
            format!("writable by its group or others (mode {mode:04o}, owner {owner})"),
            format!("chmod go-w {shown}"),
        ),
    };
    Some(format!(
        "{what}: whoever else can write it could {harm}; refused (run: {fix})"
    ))
}

/// Who `chown` should name: this user, or root.
fn chown_to(me: u32) -> String {
    if me == 0 {
        "root".into()
    } else {
        user_name(me).unwrap_or_else(|| me.to_string())
    }
}

/// The name of user `uid` in `/etc/passwd`, if it has one there (no NSS: cronlock is static).
fn user_name(uid: u32) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open("/etc/passwd")
        .ok()?
        .take(4 << 20)
        .read_to_string(&mut text)
        .ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?.parse::<u32>().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn group_or_other_write_is_refused_with_the_fix() {
        let dir = std::env::temp_dir().join(format!("cronlock-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, "x").unwrap();
        for (mode, ok) in [(0o644, true), (0o600, true), (0o664, false), (0o646, false)] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            let meta = std::fs::metadata(&file).unwrap();
            let said = untrusted(&file, &meta, "run commands");
            assert_eq!(said.is_none(), ok, "{mode:o}: {said:?}");
            if let Some(line) = said {
                assert!(line.contains(&format!("mode {mode:04o}")), "{line}");
                assert!(line.contains("chmod go-w"), "{line}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
