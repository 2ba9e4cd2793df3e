//! Which entries of a striped ledger each bookie holds (ADR 0017).
//!
//! A ledger's ensemble is the writer's bookie and `modulus` replicas, in the record's order
//! (their *positions*, `0..modulus`). The writer's bookie holds every entry. Entry `e` also goes
//! to the `width` replicas from position `e mod modulus` on, wrapping: its *write set*. So
//! position `p` holds the entries whose residue mod `modulus` is one of `p, p − 1, …,
//! p − width + 1` (mod `modulus`): its [`Stripe`]. With `width == modulus` every replica holds
//! every entry (a whole copy, every ledger before ADR 0017).
//!
//! Invariants:
//! - `1 <= width <= modulus` ([`Stripes::new`] clamps); a stripe's residues are distinct,
//!   ascending and below its modulus, and there are `width` of them.
//! - A stripe's entries are ordered: its `k`-th entry is computable from `k`
//!   ([`Stripe::nth`]), so a copy holding a stripe stays positional.

/// The most replica places a ledger has (the namespace policy allows ensembles of up to 16):
/// the first entry of any stripe is below it.
pub const MAX_REPLICA_PLACES: u64 = 15;

/// How one ledger's entries are spread over its replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stripes {
    /// Replica positions (the ensemble less the writer's bookie).
    modulus: u32,
    /// Replicas each entry goes to besides the writer's bookie (the write quorum less one).
    width: u32,
}

impl Stripes {
    /// `replicas` positions, each entry on `width` of them (clamped to `1..=replicas`; no
    /// replica: one position holding nothing is never asked for).
    pub fn new(replicas: usize, width: usize) -> Stripes {
        let modulus = u32::try_from(replicas.max(1)).unwrap_or(u32::MAX);
        let width = u32::try_from(width).unwrap_or(u32::MAX).clamp(1, modulus);
        Stripes { modulus, width }
    }

    /// Every replica holds every entry.
    pub fn whole(replicas: usize) -> Stripes {
        Stripes::new(replicas, replicas)
    }

    /// Whether each replica holds every entry.
    pub fn is_whole(&self) -> bool {
        self.width == self.modulus
    }

    /// Replica positions.
    pub fn positions(&self) -> usize {
        self.modulus as usize
    }

    /// Replicas each entry goes to.
    pub fn width(&self) -> usize {
        self.width as usize
    }

    /// The replica positions entry `entry` goes to, in write order.
    pub fn write_set(&self, entry: u64) -> impl Iterator<Item = usize> {
        let m = u64::from(self.modulus);
        let first = entry % m;
        (0..u64::from(self.width)).map(move |j| ((first + j) % m) as usize)
    }

    /// Whether position `position` is in entry `entry`'s write set.
    pub fn in_write_set(&self, entry: u64, position: usize) -> bool {
        self.stripe(position).holds(entry)
    }

    /// The stripe replica position `position` holds.
    pub fn stripe(&self, position: usize) -> Stripe {
        let m = self.modulus;
        let p = u32::try_from(position).unwrap_or(u32::MAX) % m;
        let mut residues: Vec<u32> = (0..self.width).map(|j| (p + m - j) % m).collect();
        residues.sort_unstable();
        Stripe {
            modulus: m,
            residues,
        }
    }
}

impl Default for Stripe {
    fn default() -> Self {
        Stripe::whole()
    }
}

/// The entries one copy holds: those whose id mod `modulus` is one of `residues`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stripe {
    modulus: u32,
    /// Invariant: distinct, ascending, each below `modulus`, at least one.
    residues: Vec<u32>,
}

impl Stripe {
    /// Every entry (the writer's copy, or any copy of an unstriped ledger).
    pub fn whole() -> Stripe {
        Stripe {
            modulus: 1,
            residues: vec![0],
        }
    }

    /// The modulus.
    pub fn modulus(&self) -> u32 {
        self.modulus
    }

    /// The residues, ascending.
    pub fn residues(&self) -> &[u32] {
        &self.residues
    }

    /// Whether it holds every entry.
    pub fn is_whole(&self) -> bool {
        self.residues.len() as u64 == u64::from(self.modulus)
    }

    /// Whether entry `entry` is in it.
    pub fn holds(&self, entry: u64) -> bool {
        let r = (entry % u64::from(self.modulus)) as u32;
        self.residues.binary_search(&r).is_ok()
    }

    /// How many of its entries are below `entry`: the place entry `entry` has in a copy
    /// holding it, if it holds it.
    pub fn count_below(&self, entry: u64) -> u64 {
        let m = u64::from(self.modulus);
        let below = self.residues.partition_point(|&r| u64::from(r) < entry % m) as u64;
        (entry / m) * self.residues.len() as u64 + below
    }

    /// Its `k`-th entry (from 0).
    pub fn nth(&self, k: u64) -> u64 {
        let w = self.residues.len() as u64;
        (k / w) * u64::from(self.modulus) + u64::from(self.residues[(k % w) as usize])
    }

    /// Its first entry at or after `entry`.
    pub fn next_from(&self, entry: u64) -> u64 {
        self.nth(self.count_below(entry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_four_two_two_ledger_puts_each_entry_on_the_writer_and_two_of_three_replicas() {
        // E = 4, WQ = 3: three replica positions, two of them per entry.
        let s = Stripes::new(3, 2);
        let sets: Vec<Vec<usize>> = (0..4).map(|e| s.write_set(e).collect()).collect();
        assert_eq!(sets, vec![vec![0, 1], vec![1, 2], vec![2, 0], vec![0, 1]]);
        assert_eq!(s.stripe(0).residues(), &[0, 2]);
        assert_eq!(s.stripe(1).residues(), &[0, 1]);
        let held: Vec<u64> = (0..4).map(|k| s.stripe(2).nth(k)).collect();
        assert_eq!(held, vec![1, 2, 4, 5]);
        assert!(!s.is_whole() && Stripes::whole(2).is_whole());
    }

    #[test]
    fn a_whole_stripe_is_every_entry_in_order() {
        let w = Stripe::whole();
        assert!(w.is_whole() && w.holds(17));
        assert_eq!((w.nth(9), w.count_below(9), w.next_from(9)), (9, 9, 9));
        assert_eq!(Stripes::whole(3).stripe(1).count_below(10), 10);
    }

    proptest! {
        /// Every stripe computation agrees with counting entries one by one.
        #[test]
        fn stripes_agree_with_counting(replicas in 1usize..8, width in 1usize..8,
                                       position in 0usize..8, entry in 0u64..200) {
            let s = Stripes::new(replicas, width);
            let p = position % replicas;
            let stripe = s.stripe(p);
            let held: Vec<u64> = (0..300).filter(|&e| s.write_set(e).any(|q| q == p)).collect();
            prop_assert_eq!(stripe.residues().len(), s.width());
            prop_assert_eq!(stripe.holds(entry), held.contains(&entry));
            prop_assert_eq!(s.in_write_set(entry, p), held.contains(&entry));
            let below = held.iter().filter(|&&e| e < entry).count() as u64;
            prop_assert_eq!(stripe.count_below(entry), below);
            prop_assert_eq!(stripe.nth(below), *held.iter().find(|&&e| e >= entry).unwrap_or(&0));
            prop_assert_eq!(stripe.next_from(entry), stripe.nth(below));
            let write_set: Vec<usize> = s.write_set(entry).collect();
            let mut distinct = write_set.clone();
            distinct.sort_unstable();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), s.width());
        }
    }
}
