//! What shipping needs: the binary is static and runs in an empty root — a directory holding only
//! the binary and `/etc/hosts`, entered with `chroot`: no `/dev`, no `/proc`, no libc, no CA store.
//! `chroot` needs root; the test command runs as root in CI, so this fails, never skips.

use std::process::Command;

use crate::common::*;

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

/// Under scripts/test.sh (CI's test command) the integration tests run the release binary, built
/// with `cargo build --release --locked` just before: the build users get and scripts/dist.sh
/// packages, whose dependencies' features are those of `[dependencies]` alone. A test build has
/// the dev-dependencies' features too, so a feature the release lacks (TLS, once) would pass
/// every test of the test build. This fails when the run was meant to test the release binary
/// (CI, or CRONLOCK_TEST_RELEASE) and the binary under test is another, or older than the source.
#[test]
fn the_tested_binary_is_the_release_build() {
    if std::env::var_os("CI").is_none() && std::env::var_os("CRONLOCK_TEST_RELEASE").is_none() {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let release = root.join("target/x86_64-unknown-linux-gnu/release/cronlock");
    let tested = std::env::var("CRONLOCK_TEST_BIN").unwrap_or_else(|_| {
        panic!("CRONLOCK_TEST_BIN is not set: the tests ran {BIN}, not the release build")
    });
    assert_eq!(
        std::fs::canonicalize(&tested).unwrap(),
        std::fs::canonicalize(&release).unwrap(),
        "the tests ran {tested}, not the release build"
    );
    let built = std::fs::metadata(&release).unwrap().modified().unwrap();
    let mut sources = vec![
        root.join("Cargo.toml"),
        root.join("Cargo.lock"),
        root.join(".cargo/config.toml"),
    ];
    sources.extend(crate::common::files_under(&root.join("src")));
    for source in sources {
        let changed = std::fs::metadata(&source).unwrap().modified().unwrap();
        assert!(
            changed <= built,
            "{} changed after the release binary was built: rebuild it (scripts/test.sh does)",
            source.display()
        );
    }
    let out = Command::new(&tested).arg("--version").output().unwrap();
    assert!(out.status.success());
}
