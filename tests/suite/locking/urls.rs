//! The locking tests of the URL: where it is read from, its forms and what it carries.

use super::*;

#[test]
fn redis_url_falls_back_to_redis_url_env() {
    let r = Redis::start();
    let out = run(cronlock(&r)
        .env_remove("CRONLOCK_REDIS_URL")
        .env("REDIS_URL", r.url())
        .args(["k", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_fenced(r.get(FENCE));
}

#[test]
fn unix_socket_urls_work() {
    let r = Redis::start();
    let url = format!("redis+unix://{}", r.sock.display());
    let out = run(cronlock(&r).args(["-u", &url, "k", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_fenced(r.get(FENCE));
}

#[test]
fn database_number_in_url_is_used() {
    let r = Redis::start_tcp();
    let url = format!("redis://127.0.0.1:{}/3", r.port);
    let out = run(cronlock(&r).args(["-u", &url, "k", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!r.exists(FENCE), "db 0 must be untouched");
    let mut con = r.con();
    redis::cmd("SELECT").arg(3).query::<()>(&mut con).unwrap();
    let f: Option<String> = redis::cmd("GET").arg(FENCE).query(&mut con).unwrap();
    assert_fenced(f);
}

#[test]
fn acl_user_and_password_in_url() {
    let r = Redis::start_tcp();
    let mut con = r.con();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("alice")
        .arg("on")
        .arg(">alice-pw")
        .arg("~*")
        .arg("+@all")
        .query::<()>(&mut con)
        .unwrap();
    let url = format!("redis://alice:alice-pw@127.0.0.1:{}", r.port);
    let out = run(cronlock(&r).args(["-u", &url, "k", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_fenced(r.get(FENCE));
    let bad = format!("redis://alice:not-alice-pw@127.0.0.1:{}", r.port);
    let out = run(cronlock(&r).args(["-u", &bad, "k", "true"]));
    assert_eq!(code(&out), 125);
    assert!(!stderr(&out).contains("not-alice-pw"), "{}", stderr(&out));
}

#[test]
fn help_never_shows_the_url_from_the_environment() {
    let r = Redis::start();
    let out = run(cronlock(&r)
        .env("CRONLOCK_REDIS_URL", "redis://:env-secret-pw@127.0.0.1:1")
        .arg("--help"));
    assert_eq!(code(&out), 0);
    assert!(!stdout(&out).contains("env-secret-pw"));
}
