//! The communication contract of trident.
//!
//! This crate owns the vocabulary that the tile IR's distributed ops, every backend and the host
//! runtime share: memory scopes and semantics, signal and compare operations, the group that
//! executes a put/get, and the vendor numbering of those constants (NVSHMEM and ROCSHMEM number
//! them differently, so the table lives here and nowhere else).
//!
//! It does not own the IR (that is `trident-core`) nor any runtime (the backends). The host-side
//! symmetric-heap and bootstrap traits join this crate with the World API.

use serde::Serialize;

#[doc(hidden)]
pub use serde as __serde;

/// Declares a closed set of keywords with their text spelling, `Display` and `parse`; used for
/// every enum the text IR spells as a word.
#[macro_export]
macro_rules! keyword_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The spelling used by the text IR.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// Parses the text IR spelling.
            pub fn parse(s: &str) -> Option<Self> {
                match s { $($text => Some($name::$variant),)+ _ => None }
            }
        }

        impl $crate::__serde::Serialize for $name {
            fn serialize<S: $crate::__serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl ::core::fmt::Display for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result { f.write_str(self.as_str()) }
        }
    };
}

keyword_enum! {
    /// The set of threads (and devices) with which a memory operation synchronizes.
    Scope {
        /// One program (CUDA block / HIP workgroup).
        Cta = "cta",
        /// One device.
        Gpu = "gpu",
        /// Every device of the node; the scope of every cross-rank operation, also when two
        /// ranks share a GPU, so that loopback worlds exercise the instructions multi-GPU runs use.
        Sys = "sys",
    }
}

keyword_enum! {
    /// Memory-ordering semantics with their C++/PTX meaning.
    MemSemantic {
        Relaxed = "relaxed",
        Acquire = "acquire",
        Release = "release",
        AcqRel = "acq_rel",
    }
}

impl MemSemantic {
    /// Whether the operation orders later accesses after it (acquire side).
    pub fn acquires(self) -> bool {
        matches!(self, MemSemantic::Acquire | MemSemantic::AcqRel)
    }

    /// Whether the operation orders earlier accesses before it (release side).
    pub fn releases(self) -> bool {
        matches!(self, MemSemantic::Release | MemSemantic::AcqRel)
    }
}

keyword_enum! {
    /// How far a `notify` travels; selects the lowering (plain store vs vendor library call).
    CommScope {
        Gpu = "gpu",
        IntraNode = "intra_node",
        InterNode = "inter_node",
    }
}

keyword_enum! {
    /// Comparison a wait applies to a signal: `signal <cmp> value`.
    CmpOp {
        Eq = "eq",
        Ne = "ne",
        Gt = "gt",
        Ge = "ge",
        Lt = "lt",
        Le = "le",
    }
}

impl CmpOp {
    /// Evaluates `a <self> b` (64-bit unsigned signals; IEEE for floats: false with a NaN,
    /// but `ne`).
    pub fn holds<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
        }
    }
}

keyword_enum! {
    /// How a signal word is updated.
    SignalOp {
        Set = "set",
        Add = "add",
    }
}

keyword_enum! {
    /// Which threads of a program cooperate in a put/get/barrier.
    Group {
        Thread = "thread",
        Warp = "warp",
        Block = "block",
    }
}

/// A vendor SHMEM library whose device ABI a backend may call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Vendor {
    Nvshmem,
    Rocshmem,
}

impl Vendor {
    /// The library's integer for a signal operation (`NVSHMEM_SIGNAL_SET` etc.).
    pub fn signal_op(self, op: SignalOp) -> i32 {
        match (self, op) {
            (Vendor::Nvshmem, SignalOp::Set) => 9,
            (Vendor::Nvshmem, SignalOp::Add) => 10,
            (Vendor::Rocshmem, SignalOp::Set) => 0,
            (Vendor::Rocshmem, SignalOp::Add) => 1,
        }
    }

    /// The library's integer for a comparison (`NVSHMEM_CMP_GE` etc.).
    pub fn cmp_op(self, op: CmpOp) -> i32 {
        match (self, op) {
            (Vendor::Nvshmem, CmpOp::Eq) => 0,
            (Vendor::Nvshmem, CmpOp::Ne) => 1,
            (Vendor::Nvshmem, CmpOp::Gt) => 2,
            (Vendor::Nvshmem, CmpOp::Le) => 3,
            (Vendor::Nvshmem, CmpOp::Lt) => 4,
            (Vendor::Nvshmem, CmpOp::Ge) => 5,
            (Vendor::Rocshmem, CmpOp::Eq) => 0,
            (Vendor::Rocshmem, CmpOp::Ne) => 1,
            (Vendor::Rocshmem, CmpOp::Gt) => 2,
            (Vendor::Rocshmem, CmpOp::Ge) => 3,
            (Vendor::Rocshmem, CmpOp::Lt) => 4,
            (Vendor::Rocshmem, CmpOp::Le) => 5,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_round_trip() {
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.as_str()), Some(*s));
        }
        for c in CmpOp::ALL {
            assert_eq!(CmpOp::parse(&c.to_string()), Some(*c));
        }
        assert_eq!(MemSemantic::parse("acq_rel"), Some(MemSemantic::AcqRel));
        assert_eq!(Group::parse("grid"), None);
    }

    #[test]
    fn vendor_numbering_differs_where_documented() {
        assert_eq!(Vendor::Nvshmem.signal_op(SignalOp::Set), 9);
        assert_eq!(Vendor::Rocshmem.signal_op(SignalOp::Add), 1);
        assert_eq!(Vendor::Nvshmem.cmp_op(CmpOp::Ge), 5);
        assert_eq!(Vendor::Rocshmem.cmp_op(CmpOp::Ge), 3);
        assert_eq!(Vendor::Nvshmem.cmp_op(CmpOp::Le), 3);
        assert_eq!(Vendor::Rocshmem.cmp_op(CmpOp::Le), 5);
    }

    #[test]
    fn cmp_semantics() {
        assert!(CmpOp::Ge.holds(5, 5));
        assert!(!CmpOp::Gt.holds(5, 5));
        assert!(CmpOp::Ne.holds(u64::MAX, 0));
    }
}
