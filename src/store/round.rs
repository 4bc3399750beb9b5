//! How the masters' answers to one acquisition round read, when they did not grant the lock:
//! another `--limit`, suspended, not yet due, the run already started, busy (with the soonest
//! expiry), or the one line that says what failed. Split from [`crate::store::quorum`], which asks and undoes.

use std::time::Duration;

use crate::duration::Span;
use crate::store::acquire::Acquire;
use crate::store::acquire::AcquireOutcome;
use crate::store::topology::{Failure, Link};

/// What an acquisition round came to: the masters' verdict, or why there is none.
pub type RoundOutcome = Result<AcquireOutcome, Refused>;

/// An acquisition that neither got the lock nor found it busy: one line, and whether trying
/// again may help.
pub struct Refused {
    pub text: String,
    pub transient: bool,
}

/// One master's answer to an acquire.
pub(super) type MasterAnswer = Result<AcquireOutcome, Lost>;

/// A master whose acquire failed; `taken`: the lock may be ours there all the same (a lost
/// reply, or taken but not replicated).
pub(super) struct Lost {
    pub failure: Failure,
    pub taken: bool,
}

/// A round that did not get the lock, when the masters' answers say why: holders with another
/// `--limit` (wherever one master says so), the run for this instant already started, or held
/// elsewhere (with the soonest expiry). `None`: failures, for [`Masters::failed`].
pub(super) fn refused(answers: &[MasterAnswer], majority: usize) -> Option<RoundOutcome> {
    if let Some(Ok(AcquireOutcome::Mismatch(other))) = answers
        .iter()
        .find(|a| matches!(a, Ok(AcquireOutcome::Mismatch(_))))
    {
        return Some(Ok(AcquireOutcome::Mismatch(*other)));
    }
    // Suspended wherever one master says so (`--suspend` wrote it on a majority).
    if let Some(Ok(AcquireOutcome::Suspended { record, instant })) = answers
        .iter()
        .find(|a| matches!(a, Ok(AcquireOutcome::Suspended { .. })))
    {
        return Some(Ok(AcquireOutcome::Suspended {
            record: record.clone(),
            instant: *instant,
        }));
    }
    // Not yet due by some master's clock: asked again when the latest of them says it is.
    let early = answers.iter().filter_map(|a| match a {
        Ok(AcquireOutcome::Early { instant, ahead }) => Some((*instant, *ahead)),
        _ => None,
    });
    if let Some((instant, ahead)) = early.max_by_key(|(_, ahead)| *ahead) {
        return Some(Ok(AcquireOutcome::Early { instant, ahead }));
    }
    let count = |f: fn(&MasterAnswer) -> bool| answers.iter().filter(|a| f(a)).count();
    let busy = count(|a| matches!(a, Ok(AcquireOutcome::Busy { .. })));
    let ran = count(|a| matches!(a, Ok(AcquireOutcome::AlreadyRan { .. })));
    if ran >= majority || (ran > 0 && ran + busy >= majority) {
        if let Some(Ok(AcquireOutcome::AlreadyRan {
            instant,
            ran,
            holder,
        })) = answers
            .iter()
            .find(|a| matches!(a, Ok(AcquireOutcome::AlreadyRan { .. })))
        {
            return Some(Ok(AcquireOutcome::AlreadyRan {
                instant: *instant,
                ran: *ran,
                holder: holder.clone(),
            }));
        }
    }
    if busy + ran < majority {
        return None;
    }
    let mut soonest: Option<Duration> = None;
    let mut value = String::new();
    let mut at = None;
    for a in answers {
        if let Ok(AcquireOutcome::Busy {
            expires_in: left,
            holder: v,
            instant,
        }) = a
        {
            if let Some(l) = left {
                soonest = Some(soonest.map_or(*l, |s| s.min(*l)));
            }
            if value.is_empty() {
                value = v.clone();
            }
            at = at.or(*instant);
        }
    }
    Some(Ok(AcquireOutcome::Busy {
        expires_in: soonest,
        holder: value,
        instant: at,
    }))
}

/// The one line for a single master's acquire that neither got the lock nor found it busy.
pub(super) fn failed_alone(
    answer: &MasterAnswer,
    undone: &Option<Result<bool, Failure>>,
    name: &str,
    within: Duration,
    ttl: Duration,
) -> RoundOutcome {
    let undo_text = |u: &Option<Result<bool, Failure>>| match u {
        Some(Ok(true)) => "the lock it took anyway was released".to_string(),
        Some(Ok(false)) => "it took no lock".into(),
        _ => format!(
            "if Redis took the lock anyway, it expires within {}",
            Span(ttl)
        ),
    };
    match answer {
        Err(Lost {
            failure: Failure::Replicas { acked, wanted },
            ..
        }) => Err(Refused {
            text: format!(
                "took lock '{name}', but only {acked} of {wanted} replicas confirmed it \
                 (--min-replicas, within --connect-timeout {}); {}, and the command did \
                 not run",
                Span(within),
                match undone {
                    Some(Ok(true)) => "released it".to_string(),
                    Some(Ok(false)) => "it was no longer ours".into(),
                    _ => format!("it expires within {}", Span(ttl)),
                }
            ),
            transient: false,
        }),
        Err(Lost { failure, taken }) => {
            let mut text = match failure {
                // "cannot connect to Redis at ...": nothing was sent.
                Failure::Connect(_) | Failure::Refused(_) => failure.to_string(),
                _ => format!("cannot acquire lock '{name}': {failure}"),
            };
            if *taken {
                text += &format!(" ({})", undo_text(undone));
            }
            Err(Refused {
                text,
                transient: failure.transient(),
            })
        }
        // A single master's lock expired while it was being replicated.
        _ => Err(Refused {
            text: format!(
                "cannot acquire lock '{name}': it was taken with no validity left \
                 (--ttl {} is too short for this Redis)",
                Span(ttl)
            ),
            transient: true,
        }),
    }
}

/// A master's answer to an attempt: a grant stands once `--min-replicas` confirmed it (within
/// `left`); a failure may have taken the lock when the call may have run.
pub(super) fn confirmed(
    link: &mut Link,
    attempt: Result<AcquireOutcome, Failure>,
    lock_key: &str,
    left: Duration,
) -> MasterAnswer {
    match attempt {
        Ok(AcquireOutcome::Held(held)) => match link.confirm(lock_key, left) {
            Ok(()) => Ok(AcquireOutcome::Held(held)),
            Err(failure) => Err(Lost {
                failure,
                taken: true,
            }),
        },
        other => unconfirmed(other),
    }
}

/// A master's answer to an attempt that needs no confirmation (not a grant): a failure may have
/// taken the lock when the call may have run.
pub(super) fn unconfirmed(attempt: Result<AcquireOutcome, Failure>) -> MasterAnswer {
    match attempt {
        Ok(other) => Ok(other),
        Err(failure) => Err(Lost {
            taken: failure.maybe_ran(),
            failure,
        }),
    }
}

/// The masters as a failure line names them: each one's URL, redacted, and how many must agree.
pub(super) struct MastersNamed<'a> {
    pub shown: &'a [&'a str],
    pub majority: usize,
}

/// The one line for an acquire (of lock `name`, given `within`) that neither got the lock nor
/// found it busy.
pub(super) fn failed(
    answers: &[MasterAnswer],
    undone: &[Option<Result<bool, Failure>>],
    ask: Acquire<'_>,
    within: Duration,
    masters: MastersNamed<'_>,
) -> RoundOutcome {
    let (name, ttl) = (ask.keys.name.as_str(), ask.ttl);
    let MastersNamed { shown, majority } = masters;
    if let ([answer], [undone]) = (answers, undone) {
        return failed_alone(answer, undone, name, within, ttl);
    }
    let granted = answers
        .iter()
        .filter(|a| matches!(a, Ok(AcquireOutcome::Held(_))))
        .count();
    let problems: Vec<String> = answers
        .iter()
        .enumerate()
        .filter_map(|(i, a)| match a {
            Err(Lost { failure, .. }) => Some(format!("{}: {failure}", shown[i])),
            _ => None,
        })
        .collect();
    let what = if problems.is_empty() {
        format!("the masters that granted it did so too late ({granted})")
    } else {
        format!(
            "{granted} of {} masters granted it, {} needed ({})",
            answers.len(),
            majority,
            problems.join("; ")
        )
    };
    // Asking again cannot help only when every master refused for good.
    let transient = !answers
        .iter()
        .all(|a| matches!(a, Err(Lost { failure, .. }) if !failure.transient()));
    Err(Refused {
        text: format!("cannot acquire lock '{name}': {what}; it was released where it was taken"),
        transient,
    })
}

/// Whether a round that found the lock busy, or the instant already run, did so only because the
/// contenders' votes split: no one holder (by its value; a finished run's free lock is one value
/// too) was answered by a majority of the masters. A grant held on a minority, undone a moment
/// later, is then not read as decided: the round is asked again.
pub(super) fn split(answers: &[MasterAnswer], majority: usize) -> bool {
    let holders: Vec<&str> = answers
        .iter()
        .filter_map(|a| match a {
            Ok(AcquireOutcome::Busy { holder, .. }) => Some(holder.as_str()),
            Ok(AcquireOutcome::AlreadyRan { holder, .. }) => Some(holder.as_deref().unwrap_or("")),
            _ => None,
        })
        .collect();
    !holders
        .iter()
        .any(|h| holders.iter().filter(|o| *o == h).count() >= majority)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(holder: &str) -> MasterAnswer {
        Ok(AcquireOutcome::Busy {
            expires_in: None,
            holder: holder.into(),
            instant: None,
        })
    }

    #[test]
    fn votes_split_when_no_holder_has_a_majority() {
        assert!(split(&[busy("a"), busy("b"), busy("c")], 2));
        assert!(split(&[busy("a"), busy("b")], 2));
        assert!(!split(&[busy("a"), busy("b"), busy("a")], 2));
        assert!(!split(
            &[busy("a"), busy("a"), busy("b"), busy("c"), busy("a")],
            3
        ));
        assert!(split(
            &[busy("a"), busy("a"), busy("b"), busy("b"), busy("c")],
            3
        ));
    }

    fn ran(holder: Option<&str>) -> MasterAnswer {
        Ok(AcquireOutcome::AlreadyRan {
            instant: 1000,
            ran: 1000,
            holder: holder.map(str::to_string),
        })
    }

    /// "Already ran" is decided only when a majority names one holder: two contenders' grants,
    /// each on one master, are a split; a finished run (its lock free) or one run holding it on
    /// a majority is not.
    #[test]
    fn already_ran_is_a_split_unless_a_majority_names_one_holder() {
        assert!(split(&[ran(Some("a")), ran(Some("b"))], 2));
        assert!(split(&[ran(Some("a")), busy("b"), ran(None)], 2));
        assert!(!split(&[ran(None), ran(None)], 2));
        assert!(!split(&[ran(Some("a")), busy("a")], 2));
    }
}
