//! Who claims which instant: the jobs of a fleet (the replicas serving the same jobs, named by a
//! hash of them and of this scheme, [`SCHEME`]) are split into shares of about [`SHARE`] jobs,
//! and each share's instants go to one replica, in turn: the live replicas not at `--max-jobs`,
//! in the order of their ids, the share's turn moved on at every instant. So a replica claims a
//! share's due jobs together (one pipeline, one wake of Redis for several claims), the shares of
//! one instant go to different replicas, and every replica takes its turn. The [`CHECKERS`]
//! replicas after the owners, in the same turn, check that instant's claims and claim what is
//! still undecided (the owner is dead, frozen, sick, or a ghost), so a settled fleet costs Redis
//! two checks an instant, whatever its size.

use crate::store::members::FleetView;

/// About how many jobs a share holds.
pub const SHARE: usize = 8;
/// The name of this ranking, in the fleet's hash: replicas that rank otherwise (another version)
/// are another fleet, and never wait for each other.
pub const SCHEME: &str = "shares-8-in-turn-2-checkers";
/// How many replicas check each instant of a settled fleet (see [`checker`]).
pub const CHECKERS: u64 = 2;

/// How many shares a fleet of `jobs` jobs has.
pub(super) fn shares(jobs: usize) -> u64 {
    jobs.div_ceil(SHARE).max(1) as u64
}

/// FNV-1a, 64 bits.
pub(super) fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The replica that claims `at` of KEY (of a fleet of `shares` shares) in `view`: KEY's share's
/// turn among the live replicas not at `--max-jobs` (among all live ones when all are; `me` when
/// none is live).
pub(super) fn owner(view: &FleetView, me: &str, key: &str, at: i64, shares: u64) -> String {
    let pool = pool(view);
    if pool.is_empty() {
        return me.to_string();
    }
    let share = fnv(key.as_bytes()) % shares.max(1);
    let turn = rank("", "", at).wrapping_add(share);
    pool[(turn % pool.len() as u64) as usize].to_string()
}

/// The pool an instant's owners and checkers come from: the live replicas not at `--max-jobs`
/// (all live ones when all are), sorted.
fn pool(view: &FleetView) -> Vec<&String> {
    let open: Vec<&String> = view
        .live
        .iter()
        .filter(|m| !view.full.contains(m))
        .collect();
    let mut pool: Vec<&String> = if open.is_empty() {
        view.live.iter().collect()
    } else {
        open
    };
    pool.sort_unstable();
    pool.dedup();
    pool
}

/// Which checker of instant `at` (in a fleet of `shares` shares) `me` is in `view`: 1 or 2, or
/// none. The checkers are the replicas
/// after the owners in the instant's turn, so with more replicas than shares no checker owns a
/// share, and with fewer the two checkers own different shares: a single replica's failure never
/// leaves an instant unchecked.
pub(super) fn checker(view: &FleetView, me: &str, at: i64, shares: u64) -> Option<u64> {
    let pool = pool(view);
    if pool.is_empty() {
        return None;
    }
    let turn = rank("", "", at);
    (1..=CHECKERS).find(|k| {
        let i = turn.wrapping_add(shares.max(1) + k - 1) % pool.len() as u64;
        pool[i as usize] == me
    })
}

/// A replica's rank for (KEY, instant): a hash every replica computes alike, whatever its
/// version (FNV-1a, then a finalizer that spreads the bits).
pub(super) fn rank(member: &str, key: &str, at: i64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = member
        .bytes()
        .chain([0])
        .chain(key.bytes())
        .chain([0])
        .chain(at.to_le_bytes());
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn view(live: &[&str], full: &[&str]) -> FleetView {
        FleetView {
            live: live.iter().map(|s| s.to_string()).collect(),
            full: full.iter().map(|s| s.to_string()).collect(),
            pokes: Vec::new(),
            redis_ms: 0,
        }
    }

    #[test]
    fn every_replica_names_the_same_owner_and_owners_spread() {
        let v = view(&["a", "b", "c"], &[]);
        let reversed = view(&["c", "b", "a"], &[]);
        let mut count: HashMap<String, usize> = HashMap::new();
        for i in 0..3000 {
            let key = format!("job{}", i % 100);
            let at = i64::from(i / 100) * 1000;
            let o = owner(&v, "a", &key, at, shares(100));
            assert_eq!(o, owner(&reversed, "c", &key, at, shares(100)));
            *count.entry(o).or_default() += 1;
        }
        for n in count.values() {
            assert!((700..1300).contains(n), "{count:?}");
        }
    }

    #[test]
    fn a_share_goes_to_one_replica_and_one_instants_shares_to_different_ones() {
        let v = view(&["a", "b", "c", "d"], &[]);
        let keys: Vec<String> = (0..20).map(|i| format!("job{i}")).collect();
        let n = shares(keys.len());
        assert_eq!(n, 3);
        for at in (0..50).map(|i| i * 1000) {
            let mut by_share: HashMap<u64, String> = HashMap::new();
            for k in &keys {
                let o = owner(&v, "a", k, at, n);
                let s = fnv(k.as_bytes()) % n;
                assert_eq!(by_share.entry(s).or_insert_with(|| o.clone()), &o);
            }
            let mut owners: Vec<&String> = by_share.values().collect();
            owners.sort();
            owners.dedup();
            assert_eq!(owners.len(), by_share.len(), "{by_share:?}");
        }
    }

    #[test]
    fn two_checkers_an_instant_and_no_single_replica_is_owner_and_both_checkers() {
        for n in 1..12 {
            let names: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
            let live: Vec<&str> = names.iter().map(String::as_str).collect();
            let v = view(&live, &[]);
            for jobs in [1, 8, 20, 40] {
                let sh = shares(jobs);
                for at in (0..40).map(|i| i * 1000) {
                    let found: Vec<(&str, u64)> = live
                        .iter()
                        .filter_map(|m| checker(&v, m, at, sh).map(|k| (*m, k)))
                        .collect();
                    // One replica per role (one replica may hold both when there is one).
                    let roles: Vec<u64> = found.iter().map(|(_, k)| *k).collect();
                    assert!(roles.contains(&1), "{n} {jobs} {at}: {found:?}");
                    if n > 1 {
                        assert!(roles.contains(&2), "{n} {jobs} {at}: {found:?}");
                    }
                    // Whoever owns a share, one checker is another replica.
                    for j in 0..jobs {
                        let o = owner(&v, "x", &format!("job{j}"), at, sh);
                        let others = found.iter().filter(|(m, _)| **m != o).count();
                        assert!(n == 1 || others >= 1, "{n} {jobs} {at}: {o} {found:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_full_or_gone_owner_passes_to_another() {
        let v = view(&["a", "b", "c"], &[]);
        let o = owner(&v, "a", "k", 5, 1);
        let rest: Vec<&str> = ["a", "b", "c"].into_iter().filter(|m| *m != o).collect();
        assert_ne!(owner(&view(&rest, &[]), "a", "k", 5, 1), o);
        assert_ne!(owner(&view(&["a", "b", "c"], &[&o]), "a", "k", 5, 1), o);
        // Everyone full: among all, as before.
        assert_eq!(
            owner(&view(&["a", "b", "c"], &["a", "b", "c"]), "a", "k", 5, 1),
            o
        );
        assert_eq!(owner(&view(&[], &[]), "me", "k", 5, 1), "me");
    }

    /// While the fleet changes (one replica joins, one or two leave, one becomes full), some
    /// live replica answers for every instant, whichever of them have seen the change yet: one
    /// that has not claims and checks by the old view; one that has, by the new view and, as
    /// `Fleets::earlier` keeps it, its roles in the old one too; one that just joined, by the new.
    #[test]
    fn while_the_fleet_changes_every_instant_has_a_replica_answering_for_it() {
        let names: Vec<String> = (0..6).map(|i| format!("r{i}")).collect();
        let all: Vec<&str> = names.iter().map(String::as_str).collect();
        let changes: Vec<(FleetView, FleetView)> = vec![
            (view(&all[..5], &[]), view(&all[..6], &[])),
            (view(&all[..6], &[]), view(&all[1..6], &[])),
            (view(&all[..6], &[]), view(&all[2..6], &[])),
            (view(&all[..5], &[]), view(&all[..5], &["r2"])),
            (view(&all[..3], &[]), view(&all[..2], &[])),
            (view(&all[..2], &[]), view(&all[..3], &[])),
        ];
        let roles = |v: &FleetView, me: &str, key: &str, at: i64, sh: u64| {
            owner(v, me, key, at, sh) == me || checker(v, me, at, sh).is_some()
        };
        for (old, new) in &changes {
            let stay: Vec<&String> = new.live.iter().filter(|m| old.live.contains(m)).collect();
            for seen in 0u32..(1 << stay.len()) {
                for jobs in [1, 8, 20] {
                    let sh = shares(jobs);
                    for at in (0..30).map(|i| i * 1000) {
                        for j in 0..jobs {
                            let key = format!("job{j}");
                            let answered = new.live.iter().any(|m| {
                                let Some(k) = stay.iter().position(|s| *s == m) else {
                                    return roles(new, m, &key, at, sh);
                                };
                                if seen & (1 << k) == 0 {
                                    roles(old, m, &key, at, sh)
                                } else {
                                    roles(new, m, &key, at, sh) || roles(old, m, &key, at, sh)
                                }
                            });
                            assert!(
                                answered,
                                "{:?} -> {:?}, seen {seen:b}, {key} {at}",
                                old.live, new.live
                            );
                        }
                    }
                }
            }
        }
    }
}
