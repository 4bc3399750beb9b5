//! Who claims which instant: the replicas of a fleet (those serving the same jobs, named by a
//! hash of them) are ranked per KEY and instant by rendezvous hashing, with hashes every
//! replica computes alike, whatever its version.

use crate::store::members::View;

/// FNV-1a, 64 bits.
pub(super) fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The replica that claims `at` of KEY in `view`: the highest rank among the live replicas not
/// at `--max-jobs` (among all live ones when all are; `me` when none is live).
pub(super) fn owner(view: &View, me: &str, key: &str, at: i64) -> String {
    let open: Vec<&String> = view
        .live
        .iter()
        .filter(|m| !view.full.contains(m))
        .collect();
    let pool: Vec<&String> = if open.is_empty() {
        view.live.iter().collect()
    } else {
        open
    };
    pool.into_iter()
        .max_by_key(|m| (rank(m, key, at), m.as_str()))
        .map_or_else(|| me.to_string(), |m| m.to_string())
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

    fn view(live: &[&str], full: &[&str]) -> View {
        View {
            live: live.iter().map(|s| s.to_string()).collect(),
            full: full.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn every_replica_names_the_same_owner_and_owners_spread() {
        let v = view(&["a", "b", "c"], &[]);
        let mut count: HashMap<String, usize> = HashMap::new();
        for i in 0..3000 {
            let key = format!("job{}", i % 100);
            let o = owner(&v, "a", &key, i64::from(i / 100) * 1000);
            assert_eq!(o, owner(&v, "c", &key, i64::from(i / 100) * 1000));
            *count.entry(o).or_default() += 1;
        }
        for n in count.values() {
            assert!((800..1200).contains(n), "{count:?}");
        }
    }

    #[test]
    fn a_full_or_gone_owner_passes_to_the_next() {
        let v = view(&["a", "b", "c"], &[]);
        let o = owner(&v, "a", "k", 5);
        let rest: Vec<&str> = ["a", "b", "c"].into_iter().filter(|m| *m != o).collect();
        let without = owner(&view(&rest, &[]), "a", "k", 5);
        assert_eq!(owner(&view(&["a", "b", "c"], &[&o]), "a", "k", 5), without);
        // Everyone full: the first of all, as before.
        assert_eq!(
            owner(&view(&["a", "b", "c"], &["a", "b", "c"]), "a", "k", 5),
            o
        );
        assert_eq!(owner(&view(&[], &[]), "me", "k", 5), "me");
    }
}
