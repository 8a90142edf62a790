//! [`GpuSet`]: which of a node's GPUs, by index — the free ones of a [`crate::Node`], those a
//! [`crate::RunningAttempt`] holds, those an [`crate::Assignment`] gives a job. A node has at
//! most [`MAX_GPUS_PER_NODE`] GPUs (the agent API refuses an inventory of more, and the
//! catalogue and the simulator's scenarios pools with more per node), so a set is one `u64`:
//! copied, compared and counted in an instruction, and never allocated.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The most GPUs a node may have: GPU indexes run `0..MAX_GPUS_PER_NODE`.
pub const MAX_GPUS_PER_NODE: u32 = 64;

/// A set of GPU indexes below [`MAX_GPUS_PER_NODE`]. Serialised as the sorted list of indexes
/// (`[0, 1, 3]`); an index of 64 or more is refused.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "Vec<u32>", try_from = "Vec<u32>")]
pub struct GpuSet(u64);

impl GpuSet {
    pub const EMPTY: GpuSet = GpuSet(0);

    /// GPUs `0..n`: every GPU of a node of `n` GPUs. `None` for more than
    /// [`MAX_GPUS_PER_NODE`].
    pub fn first(n: u32) -> Option<GpuSet> {
        match n {
            0 => Some(GpuSet::EMPTY),
            1..=MAX_GPUS_PER_NODE => Some(GpuSet(u64::MAX >> (MAX_GPUS_PER_NODE - n))),
            _ => None,
        }
    }

    /// The set of `indexes`; `None` if one is [`MAX_GPUS_PER_NODE`] or more.
    pub fn from_indexes(indexes: impl IntoIterator<Item = u32>) -> Option<GpuSet> {
        let mut set = GpuSet::EMPTY;
        for i in indexes {
            set.insert(i).then_some(())?;
        }
        Some(set)
    }

    /// How many GPUs.
    pub fn len(self) -> u32 {
        self.0.count_ones()
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn contains(self, index: u32) -> bool {
        index < MAX_GPUS_PER_NODE && self.0 & (1 << index) != 0
    }

    /// Adds `index`; false (and nothing added) if it is [`MAX_GPUS_PER_NODE`] or more.
    pub fn insert(&mut self, index: u32) -> bool {
        if index >= MAX_GPUS_PER_NODE {
            return false;
        }
        self.0 |= 1 << index;
        true
    }

    /// Whether every GPU of `self` is in `other`.
    pub fn is_subset(self, other: GpuSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// Whether the two share no GPU.
    pub fn is_disjoint(self, other: GpuSet) -> bool {
        self.0 & other.0 == 0
    }

    pub fn union(self, other: GpuSet) -> GpuSet {
        GpuSet(self.0 | other.0)
    }

    /// The GPUs of `self` not in `other`.
    pub fn difference(self, other: GpuSet) -> GpuSet {
        GpuSet(self.0 & !other.0)
    }

    /// The `n` lowest indexes of the set (all of it when it has `n` or fewer).
    pub fn lowest(self, n: u32) -> GpuSet {
        if n >= self.len() {
            return self;
        }
        let mut rest = self.0;
        let mut taken = 0u64;
        for _ in 0..n {
            let bit = rest & rest.wrapping_neg();
            taken |= bit;
            rest ^= bit;
        }
        GpuSet(taken)
    }

    /// The indexes, lowest first.
    pub fn iter(self) -> impl Iterator<Item = u32> {
        let mut rest = self.0;
        std::iter::from_fn(move || {
            (rest != 0).then(|| {
                let i = rest.trailing_zeros();
                rest &= rest - 1;
                i
            })
        })
    }

    /// The indexes, lowest first, as a vector.
    pub fn to_vec(self) -> Vec<u32> {
        self.iter().collect()
    }
}

impl fmt::Debug for GpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl From<GpuSet> for Vec<u32> {
    fn from(set: GpuSet) -> Vec<u32> {
        set.to_vec()
    }
}

impl TryFrom<Vec<u32>> for GpuSet {
    type Error = String;

    fn try_from(indexes: Vec<u32>) -> Result<GpuSet, String> {
        GpuSet::from_indexes(indexes.iter().copied()).ok_or_else(|| {
            format!(
                "GPU indexes run 0 to {}: a node has at most {MAX_GPUS_PER_NODE} GPUs",
                MAX_GPUS_PER_NODE - 1
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_and_lowest_take_the_lowest_indexes() {
        assert_eq!(GpuSet::first(0), Some(GpuSet::EMPTY));
        assert_eq!(GpuSet::first(3).map(GpuSet::to_vec), Some(vec![0, 1, 2]));
        assert_eq!(GpuSet::first(64).map(GpuSet::len), Some(64));
        assert_eq!(GpuSet::first(65), None);
        let free = GpuSet::from_indexes([1, 3, 4, 63]).expect("< 64");
        assert_eq!(free.lowest(2).to_vec(), vec![1, 3]);
        assert_eq!(free.lowest(0), GpuSet::EMPTY);
        assert_eq!(free.lowest(9), free);
        assert_eq!(free.difference(free.lowest(2)).to_vec(), vec![4, 63]);
        assert!(free.lowest(2).is_subset(free) && !free.is_subset(free.lowest(2)));
    }

    #[test]
    fn indexes_past_the_limit_are_refused() {
        assert_eq!(GpuSet::from_indexes([0, 64]), None);
        let mut set = GpuSet::EMPTY;
        assert!(!set.insert(64) && set.is_empty() && !set.contains(64));
        assert!(GpuSet::try_from(vec![0, 64]).is_err());
    }

    #[test]
    fn serialises_as_sorted_indexes() {
        let set = GpuSet::from_indexes([5, 0, 2]).expect("< 64");
        assert_eq!(Vec::from(set), vec![0, 2, 5]);
        assert_eq!(GpuSet::try_from(vec![2, 0, 5, 5]), Ok(set));
        assert_eq!(format!("{set:?}"), "{0, 2, 5}");
    }
}
