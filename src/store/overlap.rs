//! `--overlap`, an overlap policy: what an instant does that finds the lock still held by an
//! earlier one, as one type. The scripts carry it out (`acquire.lua`); everything else asks it.

use crate::store::keys::MAX_LIMIT;

/// `--overlap`: what an instant does that finds the lock still held by an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Overlap {
    /// It is recorded `skipped` (reason `overlap`).
    #[default]
    Skip,
    /// The first waits (`queued`) and runs as soon as the lock is free; a further one is skipped.
    Queue,
    /// It replaces the earlier run: that run's lock becomes this one's, that run stops (its
    /// entry reads `replaced`), and this one's command starts once it is gone.
    Replace,
    /// Each instant holds a lock of its own ([`crate::store::keys::Keys::at`]): instants run
    /// side by side, at most `at_once` of them (`--limit`; [`MAX_LIMIT`] without one), a further
    /// one is skipped.
    Allow { at_once: u32 },
}

/// What a new overlap policy touches, and why each must (see ARCHITECTURE.md, "An overlap
/// policy"): this type (its word and what it asks of the rest), `acquire.lua` (what an instant
/// that finds the lock held does, decided atomically with the claim), and `release.lua` or
/// [`crate::store::keys::Keys`] only if its release or its keys differ (`replace`, `allow`).
impl Overlap {
    /// Every policy, as `--overlap` names them (`allow`'s cap is `--limit`'s, resolved later).
    pub const ALL: [Overlap; 4] = [
        Overlap::Skip,
        Overlap::Queue,
        Overlap::Replace,
        Overlap::Allow { at_once: MAX_LIMIT },
    ];

    /// As `--overlap` and `acquire.lua` name it.
    pub fn word(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Queue => "queue",
            Overlap::Replace => "replace",
            Overlap::Allow { .. } => "allow",
        }
    }

    /// The policy `--overlap WORD` names.
    pub fn from_word(word: &str) -> Option<Overlap> {
        Overlap::ALL.into_iter().find(|o| o.word() == word)
    }

    /// A busy instant waits for the lock (`queue`): a firing waits at least a period for it, and
    /// a replica claims it again when the run before it ends or its lock would lapse.
    pub fn waits(self) -> bool {
        self == Overlap::Queue
    }

    /// Each instant holds a lock of its own (`allow`): its cap, the instants at once.
    pub fn at_once(self) -> Option<u32> {
        match self {
            Overlap::Allow { at_once } => Some(at_once),
            _ => None,
        }
    }
}
