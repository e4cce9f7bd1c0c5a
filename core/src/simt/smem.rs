//! Shared-memory matrix layouts of asynchronous matrix instructions (`wgmma`): the swizzle, the
//! 64-bit matrix descriptor and the address of an operand element, as trident reads the PTX ISA
//! ("Shared Memory Matrix Layout", "Matrix Descriptor Format"). The lowering lays stages out
//! with [`swizzle`]; `cpu-simt` executes `wgmma` through [`Descriptor::decode`] and
//! [`element_address`], so a disagreement between this reading and the hardware shows up as a
//! GPU-only failure of the conformance GEMMs.
//!
//! A swizzled layout is made of atoms of 8 rows of `width` bytes (128, 64 or 32) whose 16-byte
//! chunks are permuted: the chunk index (address bits 4 and up) is XORed with the row within the
//! atom (address bits 7 and up), as many bits as `width / 16` needs. The permutation acts on the
//! absolute shared address, so atoms start at multiples of `8 * width` bytes (a zero base
//! offset in the descriptor).

/// The physical byte address of logical byte address `addr` in a layout swizzled at `width`
/// bytes (0: no swizzle).
pub fn swizzle(addr: u32, width: u32) -> u32 {
    match width {
        32 | 64 | 128 => addr ^ (((addr >> 7) & (width / 16 - 1)) << 4),
        _ => addr,
    }
}

/// The fields of a `wgmma` matrix descriptor, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// Shared-memory address of the matrix's first element.
    pub start: u32,
    /// Leading-dimension byte offset: for MN-major swizzled layouts the distance between atoms
    /// along M/N (`width / 2` 16-bit elements apart); unused (1) for K-major swizzled layouts.
    pub lbo: u32,
    /// Stride-dimension byte offset: the distance between groups of 8 rows (K-major: along M/N;
    /// MN-major: along K).
    pub sbo: u32,
    /// Swizzle width in bytes: 128, 64, 32, or 0 for none.
    pub swizzle: u32,
}

impl Descriptor {
    /// The swizzle mode field (bits 62-63): 1 = 128 B, 2 = 64 B, 3 = 32 B, 0 = none.
    pub fn mode(width: u32) -> u64 {
        match width {
            128 => 1,
            64 => 2,
            32 => 3,
            _ => 0,
        }
    }

    /// Every field but the start address, encoded (the lowering adds the address at run time).
    pub fn fixed_bits(lbo: u32, sbo: u32, swizzle: u32) -> u64 {
        let enc = |x: u32| ((x as u64) & 0x3ffff) >> 4;
        enc(lbo) << 16 | enc(sbo) << 32 | Self::mode(swizzle) << 62
    }

    /// The start-address field of shared address `start`.
    pub fn start_bits(start: u32) -> u64 {
        ((start as u64) & 0x3ffff) >> 4
    }

    pub fn encode(&self) -> u64 {
        Self::start_bits(self.start) | Self::fixed_bits(self.lbo, self.sbo, self.swizzle)
    }

    pub fn decode(bits: u64) -> Descriptor {
        let field = |shift: u32| (((bits >> shift) & 0x3fff) << 4) as u32;
        let swizzle = match bits >> 62 {
            1 => 128,
            2 => 64,
            3 => 32,
            _ => 0,
        };
        Descriptor { start: field(0), lbo: field(16), sbo: field(32), swizzle }
    }
}

/// The shared address of element (`mn`, `k`) of an operand of `size`-byte elements described
/// by `d` (swizzled layouts only): K-major (`mn_major` false) rows of `width` bytes along M/N,
/// 8-row groups `sbo` apart; MN-major rows of `width` bytes along K, atoms of `width / size`
/// elements along M/N `lbo` apart and 8-row groups along K `sbo` apart. `None` for the
/// unswizzled layout (not used by trident).
pub fn element_address(d: &Descriptor, mn_major: bool, mn: u32, k: u32, size: u32) -> Option<u32> {
    let w = d.swizzle;
    if w == 0 {
        return None;
    }
    let logical = if mn_major {
        let per_atom = w / size;
        d.start + (mn / per_atom) * d.lbo + (k / 8) * d.sbo + (k % 8) * w + (mn % per_atom) * size
    } else {
        d.start + (mn / 8) * d.sbo + (mn % 8) * w + k * size
    };
    Some(swizzle(logical, w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_swizzles_permute_chunks() {
        let d = Descriptor { start: 0x2460, lbo: 8192, sbo: 1024, swizzle: 128 };
        assert_eq!(Descriptor::decode(d.encode()), d);
        assert_eq!(d.encode() >> 62, 1);
        for w in [32u32, 64, 128] {
            // Within one pattern (8 rows of w bytes) the swizzle is a permutation of 16-byte
            // chunks that keeps every chunk in its row.
            let mut seen = std::collections::HashSet::new();
            for a in (0..8 * w).step_by(16) {
                let p = swizzle(a, w);
                assert_eq!(p / w, a / w, "row kept");
                assert!(seen.insert(p));
            }
        }
        // Row 3 of a 128-byte layout: chunk c lands at c ^ 3.
        assert_eq!(swizzle(3 * 128 + 5 * 16 + 2, 128), 3 * 128 + (5 ^ 3) * 16 + 2);
    }
}
