//! Load balance: the `load_balance_num` a new notice gets, so that N
//! partitions can be split over K workers.
//!
//! Workers filter by partition ([`WorkerConfig::partitions`](crate::worker::WorkerConfig)).
//! To split N partitions over K workers, give worker k the numbers
//! `{ p : p mod K == k }`; a worker with no partition list takes every
//! partition, so one unfiltered worker can back up partitioned ones.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// How `load_balance_num` is chosen at insert when the notice does not set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "strategy", rename_all = "snake_case")]
pub enum LoadBalance {
    /// Always this number. The default is `Fixed { num: 0 }`.
    Fixed {
        /// The partition.
        num: i32,
    },
    /// 0, 1, …, n-1, 0, 1, … per notifier.
    RoundRobin {
        /// Number of partitions.
        partitions: u32,
    },
    /// Uniformly random in `0..n`.
    Random {
        /// Number of partitions.
        partitions: u32,
    },
    /// [`hash_partition`] of the key given with
    /// [`NewNotice::load_balance_key`](crate::NewNotice::load_balance_key)
    /// (notices without a key get 0), so one key always lands on one partition.
    Hash {
        /// Number of partitions.
        partitions: u32,
    },
}

impl LoadBalance {
    /// The partition count, or `None` for a fixed partition.
    fn partitions(self) -> Option<u32> {
        match self {
            LoadBalance::Fixed { .. } => None,
            LoadBalance::RoundRobin { partitions }
            | LoadBalance::Random { partitions }
            | LoadBalance::Hash { partitions } => Some(partitions),
        }
    }

    /// Checks that a partition count is at least 1 and fits the column.
    pub fn validate(self) -> Result<(), String> {
        match self.partitions() {
            Some(0) => Err("load balance needs at least one partition".into()),
            Some(n) if n > i32::MAX as u32 => Err("too many partitions".into()),
            _ => Ok(()),
        }
    }
}

/// Picks partitions according to a [`LoadBalance`]; one per notifier.
#[derive(Debug, Default)]
pub(crate) struct Balancer {
    strategy: LoadBalance,
    next: AtomicU64,
}

impl Balancer {
    pub fn new(strategy: LoadBalance) -> Self {
        Balancer {
            strategy,
            next: AtomicU64::new(0),
        }
    }

    /// The partition of the next notice, given its optional key.
    pub fn pick(&self, key: Option<&str>) -> i32 {
        let fit = |n: u64, partitions: u32| (n % u64::from(partitions.max(1))) as i32;
        match self.strategy {
            LoadBalance::Fixed { num } => num,
            LoadBalance::RoundRobin { partitions } => {
                fit(self.next.fetch_add(1, Ordering::Relaxed), partitions)
            }
            LoadBalance::Random { partitions } => fit(fastrand::u64(..), partitions),
            LoadBalance::Hash { partitions } => key.map_or(0, |k| hash_partition(k, partitions)),
        }
    }
}

impl Default for LoadBalance {
    fn default() -> Self {
        LoadBalance::Fixed { num: 0 }
    }
}

/// The partition of `key` among `partitions`: FNV-1a (64-bit) of the key's
/// UTF-8 bytes, modulo `partitions`. Stable across versions and languages,
/// so producers elsewhere can compute the same number.
pub fn hash_partition(key: &str, partitions: u32) -> i32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % u64::from(partitions.max(1))) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_stay_in_range() {
        let rr = Balancer::new(LoadBalance::RoundRobin { partitions: 3 });
        let picks: Vec<i32> = (0..7).map(|_| rr.pick(None)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2, 0]);
        let random = Balancer::new(LoadBalance::Random { partitions: 4 });
        assert!(
            (0..1000)
                .map(|_| random.pick(None))
                .all(|p| (0..4).contains(&p))
        );
        let fixed = Balancer::new(LoadBalance::Fixed { num: 7 });
        assert_eq!(fixed.pick(Some("x")), 7);
    }

    #[test]
    fn hash_is_stable_and_keyed() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c.
        assert_eq!(
            hash_partition("a", u32::MAX),
            (0xaf63_dc4c_8601_ec8c_u64 % u64::from(u32::MAX)) as i32
        );
        let h = Balancer::new(LoadBalance::Hash { partitions: 8 });
        assert_eq!(h.pick(Some("order-42")), h.pick(Some("order-42")));
        assert_eq!(h.pick(None), 0);
        assert!(LoadBalance::Hash { partitions: 0 }.validate().is_err());
    }
}
