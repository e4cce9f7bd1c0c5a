//! The launch ABI: the hidden parameters every lowered kernel takes after its own ([`Hidden`],
//! their names and types in [`HIDDEN_PARAMS`]), the values a runtime fills them with
//! ([`HiddenArgs`]), the words of `barrier_all` and the record a timed-out wait leaves
//! ([`diag`]). The lowering reads the parameters by these definitions; the runtimes
//! (`trident-gpu-runtime`, the CPU world, cpu-simt) fill them by these definitions: nothing else
//! spells the ABI out.

use crate::backend::KernelArg;
use crate::simt::SType;

/// The kernel ABI's hidden parameters: every lowered kernel takes them after its own, in this
/// order, filled by the runtime ([`HIDDEN_PARAMS`] gives their names and types).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hidden {
    /// This rank (i32).
    Rank,
    /// Ranks in the world (i32).
    NumRanks,
    /// u64 per rank: the base address of each rank's symmetric heap (`symm_at` rebases
    /// between two entries).
    HeapBases,
    /// The wait diagnostics record ([`diag`]).
    Diag,
    /// Bound of every wait, in nanoseconds of the target's clock (u64).
    WaitBoundNs,
    /// This rank's `barrier_all` words, at the same symmetric offset on every rank
    /// ([`BARRIER_WORDS`] u64: arrival count, generation, arrivals of ranks): intra-node,
    /// every rank counts on rank 0's (reached through `symm_at`); inter-node, each rank's last
    /// program signals every rank's third word through the vendor library.
    Barrier,
}

impl Hidden {
    pub const ALL: [Hidden; 6] =
        [Hidden::Rank, Hidden::NumRanks, Hidden::HeapBases, Hidden::Diag, Hidden::WaitBoundNs, Hidden::Barrier];

    /// Position among the hidden parameters.
    pub fn position(self) -> usize {
        Hidden::ALL.iter().position(|h| *h == self).unwrap_or(0)
    }

    /// Parameter index of this hidden parameter in a lowered kernel of `params` parameters
    /// (its own, then the hidden ones).
    pub fn index_among(self, params: usize) -> u32 {
        (params - HIDDEN_PARAMS.len() + self.position()) as u32
    }
}

/// The u64 words of a rank's `barrier_all` ([`Hidden::Barrier`]).
pub const BARRIER_WORDS: usize = 3;

/// The hidden arguments of one launch: what a runtime fills [`Hidden`]'s parameters with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HiddenArgs {
    pub rank: usize,
    pub ranks: usize,
    /// Address of the heap-base table (a u64 per rank).
    pub heap_bases: u64,
    /// Address of the rank's wait diagnostics record ([`diag`]).
    pub diag: u64,
    pub wait_bound: std::time::Duration,
    /// Address of the rank's `barrier_all` words.
    pub barrier: u64,
}

impl HiddenArgs {
    /// The kernel arguments, in [`Hidden::ALL`] order, that follow a launch's own.
    pub fn args(&self) -> [KernelArg; 6] {
        [
            KernelArg::i32(self.rank as i32),
            KernelArg::i32(self.ranks as i32),
            KernelArg::Ptr(self.heap_bases),
            KernelArg::Ptr(self.diag),
            KernelArg::u64(self.wait_bound.as_nanos().min(u64::MAX as u128) as u64),
            KernelArg::Ptr(self.barrier),
        ]
    }
}

/// Names and types of the hidden parameters, in [`Hidden::ALL`] order.
pub const HIDDEN_PARAMS: &[(&str, SType)] = &[
    ("__rank", SType::Int { bits: 32, signed: true }),
    ("__num_ranks", SType::Int { bits: 32, signed: true }),
    ("__heap_bases", SType::Ptr),
    ("__diag", SType::Ptr),
    ("__wait_bound_ns", SType::Int { bits: 64, signed: false }),
    ("__barrier", SType::Ptr),
];

/// Layout of the diagnostics record a timed-out wait fills (u64 words), and its decoding.
pub mod diag {
    use crate::ir::CmpOp;

    /// 0: nothing happened; 2: a lane claimed the record and is filling it; 1: filled (the
    /// first claimant wins; every waiting program sees a nonzero flag and stops).
    pub const FLAG: usize = 0;
    pub const RANK: usize = 1;
    pub const PROGRAM_X: usize = 2;
    pub const PROGRAM_Y: usize = 3;
    pub const PROGRAM_Z: usize = 4;
    pub const SIGNAL: usize = 5;
    pub const EXPECTED: usize = 6;
    pub const SEEN: usize = 7;
    pub const CMP: usize = 8;
    /// [`kernel_tag`] of the kernel whose wait timed out: the runtime names the kernel by it
    /// (several kernels of a rank may wait at once, and a world of processes knows only its own
    /// kernels' names).
    pub const KERNEL: usize = 9;
    pub const WORDS: usize = 10;
    /// The [`CMP`] word of a flagged word's wait (`load_flagged`): its high 32 bits, the flag,
    /// were to equal [`EXPECTED`]; [`SEEN`] holds the flag seen.
    pub const CMP_FLAG: u64 = 0x100;

    /// The tag of kernel `name` in a wait record: FNV-1a of the name (never 0, so that a record
    /// written by an older lowering, without the word, is told apart).
    pub fn kernel_tag(name: &str) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        h.max(1)
    }

    /// A filled record: which wait timed out, and what it saw.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Record {
        pub rank: u64,
        pub program: [u32; 3],
        /// Address of the signal (of the flagged word).
        pub signal: u64,
        /// The wait was a flagged word's (`load_flagged`): `expected` and `seen` are flags.
        pub flagged: bool,
        pub cmp: CmpOp,
        pub expected: u64,
        pub seen: u64,
        /// [`kernel_tag`] of the kernel that waited.
        pub kernel: u64,
    }

    impl Record {
        /// The record in `bytes` (little-endian words), if a wait timed out.
        pub fn decode(bytes: &[u8]) -> Option<Record> {
            let w = |i: usize| {
                bytes.get(8 * i..8 * i + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes).unwrap_or(0)
            };
            if w(FLAG) == 0 {
                return None;
            }
            Some(Record {
                rank: w(RANK),
                program: [w(PROGRAM_X) as u32, w(PROGRAM_Y) as u32, w(PROGRAM_Z) as u32],
                signal: w(SIGNAL),
                flagged: w(CMP) == CMP_FLAG,
                cmp: CmpOp::ALL.get(w(CMP) as usize).copied().unwrap_or(CmpOp::Ge),
                expected: w(EXPECTED),
                seen: w(SEEN),
                kernel: w(KERNEL),
            })
        }

        /// The diagnostic line, with the signal named as `place` (a buffer and index where the
        /// runtime knows it).
        pub fn message(&self, place: &str, bound: std::time::Duration) -> String {
            if self.flagged {
                return format!(
                    "wait timed out after {bound:?} on rank {}: flagged word {place} expected flag {}, seen flag {}; every program of the launch was stopped",
                    self.rank, self.expected, self.seen
                );
            }
            format!(
                "wait timed out after {bound:?} on rank {}: signal {place} expected {} {}, seen {}; every program of the launch was stopped",
                self.rank, self.cmp, self.expected, self.seen
            )
        }
    }

    /// The comparison's number in the record (`CmpOp::ALL` order).
    pub fn cmp_code(c: CmpOp) -> u64 {
        CmpOp::ALL.iter().position(|x| *x == c).unwrap_or(0) as u64
    }
}
