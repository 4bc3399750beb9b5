//! What shipping needs: the binary is static and runs in an empty root — a directory holding only
//! the binary and `/etc/hosts`, entered with `chroot`: no `/dev`, no `/proc`, no libc, no CA store.
//! `chroot` needs root; the test command runs as root in CI, so this fails, never skips.

mod common;

use std::process::Command;

use common::*;

fn empty_root(name: &str) -> Scratch {
    let root = scratch(name);
    std::fs::create_dir(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/hosts"), "127.0.0.1 redis.internal\n").unwrap();
    std::fs::copy(bin(), root.join("cronlock")).unwrap();
    root
}

fn in_root(root: &Scratch, args: &[&str]) -> std::process::Output {
    Command::new("chroot")
        .arg(root.as_os_str())
        .arg("/cronlock")
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .expect("chroot(8) must be installed (coreutils) and the tests run as root")
}

#[test]
fn the_binary_runs_in_an_empty_root() {
    assert!(
        !String::from_utf8_lossy(&Command::new("ldd").arg(bin()).output().unwrap().stdout)
            .contains("libc.so"),
        "{} is dynamically linked",
        bin()
    );
    let r = Redis::start_tcp();
    let root = empty_root("empty-root");
    let url = format!("redis://redis.internal:{}", r.port);
    // A name from /etc/hosts, a lock on the loopback Redis, a command run under it (the binary
    // itself: there is nothing else in there), the run recorded.
    let out = in_root(
        &root,
        &["-u", &url, "-v", "k", "--", "/cronlock", "--version"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("cronlock "));
    assert!(
        stderr(&out).contains("released lock 'k'"),
        "{}",
        stderr(&out)
    );
    let out = in_root(&root, &["-u", &url, "--status", "k"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("exited with status 0"));

    // No panic where /dev, /proc or a CA store is missing: one clear line and 125.
    let out = in_root(
        &root,
        &["-u", "rediss://redis.internal:1", "k", "--", "/cronlock"],
    );
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    one_line(&out);
    let out = in_root(
        &root,
        &["-u", "redis://no-such-host:6379", "k", "--", "/cronlock"],
    );
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(one_line(&out).contains("no-such-host"), "{}", stderr(&out));
}
