//! A crontab, and a file holding a URL, that only their owner can change, as cron demands: a file
//! writable by its group or others, or owned by another user than the replica's (or root), is
//! refused at start (125, one line naming its owner and mode and the fix; nothing runs) and on
//! reload (the old table keeps serving). As root, and as an unprivileged user the test creates.

use std::os::unix::fs::{chown, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::replicas::{crontab, replica, replica_err, stop};
use crate::common::*;

/// `nobody`: a user who is neither root nor the replica's.
const NOBODY: u32 = 65534;

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The exit status of `c` if it ends within `within` (else it is killed and None).
fn exits_within(mut c: Child, within: Duration) -> Option<i32> {
    let ended = wait_for(within, || c.try_wait().unwrap().is_some());
    if !ended {
        let _ = c.kill();
        let _ = c.wait();
        return None;
    }
    c.wait().unwrap().code()
}

/// As root: a 0666 file, a 0664 file and a file owned by another user are refused at start, with
/// one line naming owner, mode and fix; a 0644 file owned by root serves.
#[test]
fn files_others_can_change_are_refused_at_start() {
    let r = Redis::start();
    for (mode, owner, says) in [
        (0o666, 0, "mode 0666"),
        (0o664, 0, "mode 0664"),
        (0o644, NOBODY, "owned by nobody (uid 65534)"),
    ] {
        let dir = scratch("refused");
        let ran = dir.join("ran");
        let file = crontab(
            &dir,
            &format!("* * * * * * owned touch {}\n", ran.display()),
        );
        set_mode(&file, mode);
        chown(&file, Some(owner), None).unwrap();
        let c = replica(&r.url(), &file, &[]);
        assert_eq!(exits_within(c, Duration::from_secs(5)), Some(125));
        let err = replica_err(&file);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{err}");
        let line = lines[0];
        assert!(
            line.starts_with(&format!("cronlock: {}: ", file.display())),
            "{line}"
        );
        assert!(line.contains(says), "{line}");
        let fix = if owner == NOBODY {
            format!("chown root {}", file.display())
        } else {
            format!("chmod go-w {}", file.display())
        };
        assert!(line.contains(&fix), "{line}");
        assert!(!ran.exists(), "a job of a refused file ran");
    }
    let dir = scratch("trusted");
    let ran = dir.join("ran");
    let file = crontab(
        &dir,
        &format!("* * * * * * owned touch {}\n", ran.display()),
    );
    set_mode(&file, 0o644);
    let c = replica(&r.url(), &file, &[]);
    assert!(
        wait_for(Duration::from_secs(10), || ran.exists()),
        "{}",
        replica_err(&file)
    );
    assert_eq!(stop(c), Some(0));
}

/// On reload, a file that became writable by others is refused in one line, and the table read
/// before keeps serving.
#[test]
fn a_reload_of_a_file_others_can_change_keeps_the_old_table() {
    let r = Redis::start();
    let dir = scratch("reload");
    let (old, new) = (dir.join("old"), dir.join("new"));
    let file = crontab(
        &dir,
        &format!("* * * * * * old-job echo x >> {}\n", old.display()),
    );
    let c = replica(&r.url(), &file, &[]);
    assert!(wait_for(Duration::from_secs(10), || old.exists()));
    std::fs::write(
        &file,
        format!("* * * * * * new-job touch {}\n", new.display()),
    )
    .unwrap();
    set_mode(&file, 0o666);
    signal(c.id() as i32, libc::SIGHUP);
    assert!(
        wait_for(Duration::from_secs(5), || replica_err(&file)
            .contains("still serving")),
        "{}",
        replica_err(&file)
    );
    let lines = |p: &Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let before = lines(&old);
    assert!(wait_for(Duration::from_secs(5), || lines(&old) >= before + 2));
    assert!(!new.exists(), "a job of the refused file ran");
    let err = replica_err(&file);
    let refusal = err.lines().find(|l| l.contains("still serving")).unwrap();
    assert!(
        refusal.contains("mode 0666") && refusal.contains("chmod go-w"),
        "{refusal}"
    );
    assert_eq!(stop(c), Some(0));
}

/// A Kubernetes ConfigMap volume: the crontab is a symlink into `..data`, itself a symlink swapped
/// atomically on an update. The file it leads to (0644, root's) serves, and the swap is read.
#[test]
fn a_configmap_shaped_directory_serves_and_reloads() {
    let r = Redis::start();
    let dir = scratch("configmap");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let version = |name: &str, text: String| {
        let v = dir.join(name);
        std::fs::create_dir(&v).unwrap();
        std::fs::write(v.join("crontab"), text).unwrap();
        set_mode(&v.join("crontab"), 0o644);
    };
    version(
        "..2026_11_26_1",
        format!("* * * * * * cm-a touch {}\n", a.display()),
    );
    std::os::unix::fs::symlink("..2026_11_26_1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/crontab", dir.join("crontab")).unwrap();
    let file = dir.join("crontab");
    let c = replica(&r.url(), &file, &[]);
    assert!(
        wait_for(Duration::from_secs(10), || a.exists()),
        "{}",
        replica_err(&file)
    );
    version(
        "..2026_11_26_2",
        format!("* * * * * * cm-b touch {}\n", b.display()),
    );
    std::os::unix::fs::symlink("..2026_11_26_2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || b.exists()),
        "{}",
        replica_err(&file)
    );
    assert_eq!(stop(c), Some(0));
}

/// The unprivileged user the test runs replicas as (created once, if missing).
fn test_user() -> (u32, u32) {
    let name = "cronlock-test";
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, name]).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    if id("-u").is_none() {
        let out = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .output()
            .expect("useradd (passwd) is needed to test as an unprivileged user");
        assert!(
            out.status.success() || id("-u").is_some(),
            "useradd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (id("-u").unwrap(), id("-g").unwrap())
}

/// As an unprivileged user: its own file and root's serve; another user's is refused.
#[test]
fn an_unprivileged_replica_trusts_its_own_files_and_roots() {
    let (uid, gid) = test_user();
    let r = Redis::start_tcp();
    // Under /tmp, with a copy of the binary: the checkout may sit in a directory the user
    // cannot enter (a CI clone in a 0700 directory).
    let base = std::env::temp_dir().join(format!("cronlock-owner-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir(&base).unwrap();
    set_mode(&base, 0o755);
    let exe = base.join("cronlock");
    std::fs::copy(bin(), &exe).unwrap();
    set_mode(&exe, 0o755);
    for (i, (owner, serves)) in [(uid, true), (0, true), (NOBODY, false)]
        .into_iter()
        .enumerate()
    {
        let dir = base.join(format!("case{i}"));
        std::fs::create_dir(&dir).unwrap();
        chown(&dir, Some(uid), Some(gid)).unwrap();
        let ran = dir.join("ran");
        let file = crontab(
            &dir,
            &format!("* * * * * * as-user touch {}\n", ran.display()),
        );
        set_mode(&file, 0o644);
        chown(&file, Some(owner), None).unwrap();
        let err_file = dir.join("replica.err");
        let mut cmd = Command::new(&exe);
        cmd.env("CRONLOCK_REDIS_URL", r.tcp_url())
            .arg("--crontab")
            .arg(&file)
            .uid(uid)
            .gid(gid)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err_file).unwrap());
        // It dies with the test, even one that fails.
        tie(&mut cmd);
        let c = spawn_fresh_copy(&mut cmd);
        let err = || std::fs::read_to_string(&err_file).unwrap_or_default();
        if serves {
            assert!(
                wait_for(Duration::from_secs(10), || ran.exists()),
                "{owner}: {}",
                err()
            );
            signal(c.id() as i32, libc::SIGTERM);
            assert_eq!(
                exits_within(c, Duration::from_secs(10)),
                Some(0),
                "{}",
                err()
            );
        } else {
            assert_eq!(
                exits_within(c, Duration::from_secs(5)),
                Some(125),
                "{}",
                err()
            );
            assert!(err().contains("owned by nobody (uid 65534)"), "{}", err());
            assert!(
                err().contains("not this user's (cronlock-test) or root's"),
                "{}",
                err()
            );
            assert!(!ran.exists());
        }
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// Spawn `cmd`, a copy of the binary just written: a process another test forks meanwhile may
/// hold it open for a moment (ETXTBSY), so the spawn is tried again for a while.
fn spawn_fresh_copy(cmd: &mut Command) -> std::process::Child {
    let mut spawned = None;
    assert!(wait_for(Duration::from_secs(10), || match cmd.spawn() {
        Ok(c) => {
            spawned = Some(c);
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => false,
        Err(e) => panic!("cannot start the replica: {e}"),
    }));
    spawned.unwrap()
}

/// A file holding the Redis URL (or the ping URL) follows the same rule, in the same words.
#[test]
fn url_files_others_can_change_are_refused() {
    let r = Redis::start();
    let dir = scratch("urlfile");
    let url_file = dir.join("url");
    std::fs::write(&url_file, r.url()).unwrap();
    set_mode(&url_file, 0o666);
    let ran = dir.join("ran");
    let out = run(Command::new(bin())
        .arg("--redis-url-file")
        .arg(&url_file)
        .args(["k", "touch"])
        .arg(&ran));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    let line = one_line(&out);
    assert!(line.contains("--redis-url-file"), "{line}");
    assert!(
        line.contains("mode 0666") && line.contains("chmod go-w"),
        "{line}"
    );
    assert!(!ran.exists());
    set_mode(&url_file, 0o600);
    let out = run(Command::new(bin())
        .arg("--redis-url-file")
        .arg(&url_file)
        .args(["k", "touch"])
        .arg(&ran));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let ping = dir.join("ping");
    std::fs::write(&ping, "http://127.0.0.1:9/ping").unwrap();
    chown(&ping, Some(NOBODY), None).unwrap();
    let out = run(cronlock(&r)
        .arg("--ping-url-file")
        .arg(&ping)
        .args(["k", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        one_line(&out).contains("owned by nobody"),
        "{}",
        stderr(&out)
    );
}

/// A TLS certificate or key file decides which server cronlock trusts: the same rule.
#[test]
fn tls_files_others_can_change_are_refused() {
    let dir = scratch("tlsfile");
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, "not read that far\n").unwrap();
    set_mode(&ca, 0o664);
    let out = run(Command::new(bin())
        .args(["-u", "rediss://127.0.0.1:1", "--tls-ca-cert"])
        .arg(&ca)
        .args(["k", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    let line = one_line(&out);
    assert!(line.contains("--tls-ca-cert"), "{line}");
    assert!(
        line.contains("mode 0664") && line.contains("chmod go-w"),
        "{line}"
    );
}
