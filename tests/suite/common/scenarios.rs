//! Scenarios several suites tell over different servers: contenders for one KEY, a vanished
//! lock stopped at once, `--limit 2` of four, the documented ACL.

use super::*;

/// Contenders for one KEY while a holder runs: every 200 ms a cronlock with `args` whose job
/// fails to `mkdir DIR/running` (and leaves `DIR/overlap`) if another job is running, until
/// [`Contenders::stop`], which returns their exit codes.
pub struct Contenders {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<i32>>>,
}

/// The job a holder runs: it holds `DIR/running` until `DIR/go` exists.
pub fn holding_job(dir: &Path) -> String {
    format!(
        "cd {} && {{ mkdir running || touch overlap; }} && touch started && \
         while [ ! -e go ]; do sleep 0.05; done; rmdir running",
        dir.display()
    )
}

/// Start `cmd` (a cronlock with its options and KEY) on [`holding_job`] in `dir`; returns once the
/// job runs.
pub fn spawn_holding(cmd: &mut Command, dir: &Path) -> Child {
    let holder = cmd
        .args(["--", "sh", "-c"])
        .arg(holding_job(dir))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || dir.join("started").exists()),
        "the holder did not start"
    );
    holder
}

impl Contenders {
    pub fn start(make: impl Fn() -> Command + Send + 'static, dir: &Path) -> Contenders {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (st, dir) = (stop.clone(), dir.to_path_buf());
        let thread = std::thread::spawn(move || {
            let mut running: Vec<Child> = Vec::new();
            let mut codes = Vec::new();
            while !st.load(Ordering::SeqCst) {
                let mut c = make();
                c.args(["sh", "-c"])
                    .arg(format!(
                        "cd {} && {{ mkdir running && rmdir running || touch overlap; }}",
                        dir.display()
                    ))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                tie(&mut c);
                // Fails only once the test has ended (its directory is gone).
                let Ok(child) = c.spawn() else { break };
                running.push(child);
                std::thread::sleep(Duration::from_millis(200));
                running.retain_mut(|c| match c.try_wait().unwrap() {
                    Some(s) => {
                        codes.push(s.code().unwrap_or(-1));
                        false
                    }
                    None => true,
                });
            }
            for mut c in running {
                codes.push(c.wait().unwrap().code().unwrap_or(-1));
            }
            codes
        });
        Contenders {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop starting new ones; wait for those running; their exit codes.
    pub fn stop(mut self) -> Vec<i32> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// A `--ttl 30s` job through `cmd` (a cronlock with its URL), started and watching its lock key
/// (the JSON log's `tracking_on` event); `vanish` then makes the lock vanish. Asserts that the
/// command is stopped (122) within 500 ms of it, and returns how long it took.
pub fn stopped_at_once(mut cmd: Command, key: &str, vanish: impl FnOnce()) -> Duration {
    use std::io::BufRead;
    // Alone from before the start: waiting for the other tests to end while the job runs could
    // outlast its `sleep 60`, and the lock would vanish after its release.
    let _alone = super::measure_alone();
    let mut c = cmd
        .args([
            "-v",
            "--log-format",
            "json",
            "--ttl",
            "30s",
            key,
            "sleep",
            "60",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = c.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("\"tracking_on\"") {
                let _ = tx.send(());
            }
            all += &line;
            all.push('\n');
        }
        all
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("cronlock did not start watching its lock");
    vanish();
    let gone = Instant::now();
    let mut status = None;
    let stopped = wait_for(Duration::from_secs(15), || {
        status = c.try_wait().unwrap();
        status.is_some()
    });
    let took = gone.elapsed();
    if !stopped {
        let _ = c.kill();
    }
    let _ = c.wait();
    let err = reader.join().unwrap();
    assert!(stopped, "the command was not stopped: {err}");
    assert_eq!(status.unwrap().code(), Some(122), "{err}");
    assert!(
        took < Duration::from_millis(500),
        "stopped {took:?} after the lock vanished"
    );
    took
}

/// Four cronlocks (`cmd` makes each, with its URL) with `--limit 2 -E 75` for `key`, each holding
/// until `DIR/go`: exactly two run (both listed by `--status`), two skip.
pub fn limit_two_of_four(cmd: impl Fn() -> Command, key: &str) {
    let dir = scratch("limit-two");
    let children: Vec<Child> = (0..4)
        .map(|_| {
            let mut c = cmd();
            c.args(["--limit", "2", "-E", "75", key, "sh", "-c"])
                .arg(format!(
                    "cd {} && touch started.$$ && while [ ! -e go ]; do sleep 0.05; done",
                    dir.display()
                ));
            tie(&mut c);
            c.stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let started = || {
        std::fs::read_dir(&*dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("started."))
            })
            .count()
    };
    assert!(wait_for(Duration::from_secs(10), || started() == 2));
    let out = run(cmd().args(["--status", "--json", key]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("status JSON");
    assert_eq!(v["holders"].as_array().map(Vec::len), Some(2), "{v}");
    // The two that skip have tried (and ended) before the holders may end: a slow start must
    // not find the lock free again.
    let mut children = children;
    let ended = |children: &mut Vec<Child>| {
        children
            .iter_mut()
            .map(|c| c.try_wait())
            .filter(|w| matches!(w, Ok(Some(_))))
            .count()
    };
    assert!(wait_for(Duration::from_secs(10), || ended(&mut children) == 2));
    std::fs::write(dir.join("go"), "").unwrap();
    let mut codes = exit_codes(children);
    codes.sort();
    assert_eq!(codes, vec![0, 0, 75, 75]);
    assert_eq!(started(), 2);
}

/// The minimal ACL line of docs/deployments.md (linked from the README), split into words, with
/// `PASSWORD` replaced.
pub fn documented_acl(password: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/deployments.md"))
        .unwrap();
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER cronlock "))
        .expect("docs/deployments.md has the ACL line");
    line.split(' ')
        .map(|w| w.replace("PASSWORD", password))
        .collect()
}
