//! The channel's messages read back as written, and its two ends.
use super::replica_side::{changed_line, released_line, renewed_line};
use super::*;

fn sample() -> Handover {
    Handover {
        key: "k".into(),
        holder: Holder::new("echo hi"),
        fence: 42,
        slot: 0,
        limit: 1,
        instant: Some(1_700_000_000_000),
        manual: false,
        attempt: 2,
        ttl: Duration::from_secs(30),
        sent_at: Instant::now(),
        own_lock: false,
        after: None,
        due: None,
        parent_pid: 42,
        watched: false,
        renewed_by_replica: true,
    }
}

#[test]
fn an_instants_own_lock_and_a_replaced_runs_deadline_read_back() {
    let at = Instant::now() + Duration::from_millis(1500);
    let h = Handover {
        own_lock: true,
        after: Some(at),
        ..sample()
    };
    let back = Handover::parse(h.line().trim_end()).unwrap();
    assert!(back.own_lock);
    assert_eq!(back.after, Some(at));
    let held = back.into_held(crate::store::keys::Keys::new("cronlock:", "k"));
    assert_eq!(held.keys.lock, "cronlock:{k}:at:1700000000000");
    // A plain handover's message is as before: neither field.
    let plain = sample().line();
    assert!(
        !plain.contains("own_lock") && !plain.contains("after"),
        "{plain}"
    );
}

#[test]
fn a_manual_instant_reads_back_as_manual() {
    let h = Handover {
        manual: true,
        ..sample()
    };
    let back = Handover::parse(h.line().trim_end()).unwrap();
    assert!(back.manual);
    assert!(!Handover::parse(sample().line().trim_end()).unwrap().manual);
    // A scheduled instant's message is as before: no `manual` field.
    assert!(!sample().line().contains("manual"));
}

#[test]
fn a_handover_reads_back_as_written() {
    let h = sample();
    let back = Handover::parse(h.line().trim_end()).unwrap();
    assert_eq!(back.holder.value, h.holder.value);
    assert_eq!(back.fence, 42);
    assert_eq!(back.instant, h.instant);
    assert_eq!(back.attempt, 2);
    assert_eq!(back.ttl, h.ttl);
    let skew = back.sent_at.as_duration().abs_diff(h.sent_at.as_duration());
    assert!(skew < Duration::from_micros(1), "{skew:?}");
}

#[test]
fn other_versions_and_shapes_are_refused() {
    let line = sample().line().replace("\"v\":6", "\"v\":7");
    let e = Handover::parse(line.trim_end()).unwrap_err().to_string();
    assert!(e.contains("version 7"), "{e}");
    assert!(Handover::parse("{}").is_err());
    assert!(Handover::parse("not json").is_err());
    let line = sample().line().replace("\"fence\":42", "\"fence\":0");
    assert!(Handover::parse(line.trim_end()).is_err());
}

#[test]
fn reports_read_back() {
    for r in [
        RunReport::Started { pid: 7 },
        RunReport::Renew,
        RunReport::Ended(RunEnd {
            status: 3,
            ending: Ending::Exited,
            duration: Duration::from_millis(1500),
        }),
    ] {
        assert_eq!(RunReport::parse(r.line().trim_end()).unwrap(), r);
    }
}

#[test]
fn release_asks_and_answers_read_back() {
    let failed = CommandEnd {
        exit: Exit::Child(3),
        ending: Ending::Exited,
        started_ms: Some(1_700_000_000_100),
        finished_ms: 1_700_000_000_900,
        interrupted: true,
    };
    let killed = CommandEnd {
        exit: Exit::Signal(9),
        ending: Ending::Signalled,
        started_ms: None,
        finished_ms: 1,
        interrupted: false,
    };
    for end in [failed, killed] {
        let ask = RunReport::Release(end);
        assert_eq!(RunReport::parse(ask.line().trim_end()).unwrap(), ask);
    }
    for answer in [
        ReleaseAnswer::Done(Released::Deleted),
        ReleaseAnswer::Done(Released::Kept),
        ReleaseAnswer::Done(Released::NotOurs),
        ReleaseAnswer::Owed("cannot reach Redis".to_string()),
        ReleaseAnswer::Failed("refused".to_string()),
    ] {
        let line = released_line(&answer);
        assert_eq!(parse_released(line.trim_end()).unwrap(), answer);
    }
    assert!(parse_released(r#"{"v":2,"kind":"released"}"#).is_err());
}

#[test]
fn a_run_the_replica_answers_does_not_release_by_itself() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut run = RunSide {
        stream: theirs,
        watched: false,
        renewed_by_replica: true,
        answers: None,
    };
    let replica = std::thread::spawn(move || {
        let mut side = ReportReader::new(ours.try_clone().unwrap());
        let asked = side.report();
        let mut reply = ours;
        reply
            .write_all(released_line(&ReleaseAnswer::Done(Released::Deleted)).as_bytes())
            .unwrap();
        asked
    });
    let answer = run.release_by_replica(&ended(), Duration::from_secs(5));
    assert_eq!(answer, Some(ReleaseAnswer::Done(Released::Deleted)));
    assert!(matches!(
        replica.join().unwrap(),
        Some(RunReport::Release(_))
    ));
    // A replica that is gone: no answer, at once.
    let (gone, theirs) = UnixStream::pair().unwrap();
    drop(gone);
    let mut run = RunSide {
        stream: theirs,
        watched: false,
        renewed_by_replica: true,
        answers: None,
    };
    let asked = Instant::now();
    assert_eq!(
        run.release_by_replica(&ended(), Duration::from_secs(5)),
        None
    );
    assert!(asked.elapsed() < Duration::from_secs(1));
}

#[test]
fn the_replica_reads_reports_until_the_end() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut run = RunSide {
        stream: theirs,
        watched: false,
        renewed_by_replica: true,
        answers: None,
    };
    run.send(&RunReport::Started { pid: 9 });
    run.stream.write_all(b"garbage\n").unwrap();
    drop(run);
    let mut replica = ReportReader::new(ours);
    assert_eq!(replica.report(), Some(RunReport::Started { pid: 9 }));
    assert_eq!(replica.report(), None);
}

#[test]
fn a_released_answer_is_read_past_changes() {
    // Read by the run itself (its watch never started): a `changed` and a `renewed` before the
    // answer are passed.
    let (mut ours, theirs) = UnixStream::pair().unwrap();
    let mut run = RunSide {
        stream: theirs,
        watched: true,
        renewed_by_replica: true,
        answers: None,
    };
    ours.write_all(changed_line().as_bytes()).unwrap();
    ours.write_all(renewed_line(Instant::now()).as_bytes())
        .unwrap();
    ours.write_all(released_line(&ReleaseAnswer::Done(Released::Kept)).as_bytes())
        .unwrap();
    let answer = run.release_by_replica(&ended(), Duration::from_secs(5));
    assert_eq!(answer, Some(ReleaseAnswer::Done(Released::Kept)));
    // (Heard on the main loop's wake-ups, through O_ASYNC: a signal the suite's process does
    // not block, so that part is told by `tests/suite/tracking.rs` on real runs.)
}

/// The replica's reading of a run's reports as the relay does it, line by line through
/// [`report_in`], until end of file (`None`).
struct ReportReader {
    reader: BufReader<UnixStream>,
}

impl ReportReader {
    fn new(stream: UnixStream) -> ReportReader {
        ReportReader {
            reader: BufReader::new(stream),
        }
    }

    fn report(&mut self) -> Option<RunReport> {
        loop {
            let mut line = Vec::new();
            match self.reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return None,
                Ok(_) => {
                    if let Some(report) = report_in(&line) {
                        return Some(report);
                    }
                }
            }
        }
    }
}

#[test]
fn a_renewal_the_replica_made_reads_back_with_when_it_was_sent() {
    let sent = Instant::now();
    let line = renewed_line(sent);
    match Message::parse(line.trim_end()).unwrap() {
        Message::Renewed { sent_boot_ns } => {
            assert_eq!(sent_boot_ns, sent.as_duration().as_nanos() as u64)
        }
        other => panic!("{other:?}"),
    }
    // Not a run's report; and a replica's handover says it renews.
    assert!(RunReport::parse(line.trim_end()).is_err());
    assert!(
        Handover::parse(sample().line().trim_end())
            .unwrap()
            .renewed_by_replica
    );
}

/// A command that exited with status 0.
fn ended() -> CommandEnd {
    CommandEnd {
        exit: Exit::Child(0),
        ending: Ending::Exited,
        started_ms: Some(1),
        finished_ms: 2,
        interrupted: false,
    }
}
