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

/// A device function of the vendor library, called by the inter-node lowering (every
/// communication op at `inter_node` scope, or all of them when a compile forces that scope).
/// The `Block` forms are called by every thread of the program together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum DeviceCall {
    /// `(dest, src, bytes, pe)`: local `src` to the symmetric `dest` on `pe`.
    PutBlock { nbi: bool },
    /// `(dest, src, bytes, pe)`: the symmetric `src` on `pe` to local `dest`.
    GetBlock { nbi: bool },
    /// `(dest, src, bytes, sig, value, pe)`: a put, then `sig` on `pe` updated by `op` once the
    /// data is delivered.
    PutSignalBlock { nbi: bool, op: SignalOp },
    /// `(sig, value, pe)`: one thread updates the signal on `pe` by `op`.
    SignalOp { op: SignalOp },
    /// Orders this PE's earlier puts before its later ones, per destination.
    Fence,
    /// Completes every outstanding put of this PE.
    Quiet,
}

/// A parameter of a [`DeviceCall`] as the library's C signature has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum CallParam {
    Ptr,
    /// `size_t` or `uint64_t`.
    U64,
    /// `int` (the PE, or the signal operation's vendor number).
    I32,
}

impl DeviceCall {
    /// Every call, for tables and tests.
    pub const ALL: [DeviceCall; 12] = [
        DeviceCall::PutBlock { nbi: false },
        DeviceCall::PutBlock { nbi: true },
        DeviceCall::GetBlock { nbi: false },
        DeviceCall::GetBlock { nbi: true },
        DeviceCall::PutSignalBlock { nbi: false, op: SignalOp::Set },
        DeviceCall::PutSignalBlock { nbi: false, op: SignalOp::Add },
        DeviceCall::PutSignalBlock { nbi: true, op: SignalOp::Set },
        DeviceCall::PutSignalBlock { nbi: true, op: SignalOp::Add },
        DeviceCall::SignalOp { op: SignalOp::Set },
        DeviceCall::SignalOp { op: SignalOp::Add },
        DeviceCall::Fence,
        DeviceCall::Quiet,
    ];

    /// The operands a caller passes, in order: the C parameters less the signal operation
    /// (the writer inserts the vendor's number for it, see [`DeviceCall::op_position`]).
    pub fn operands(self) -> usize {
        self.params().len() - usize::from(self.op_position().is_some())
    }

    /// The C parameters, in order; [`CallParam::I32`] at [`DeviceCall::op_position`] is the
    /// signal operation's vendor number.
    pub fn params(self) -> &'static [CallParam] {
        use CallParam::*;
        match self {
            DeviceCall::PutBlock { .. } | DeviceCall::GetBlock { .. } => &[Ptr, Ptr, U64, I32],
            DeviceCall::PutSignalBlock { .. } => &[Ptr, Ptr, U64, Ptr, U64, I32, I32],
            DeviceCall::SignalOp { .. } => &[Ptr, U64, I32, I32],
            DeviceCall::Fence | DeviceCall::Quiet => &[],
        }
    }

    /// Where the signal operation's number goes among [`DeviceCall::params`], with the
    /// operation.
    pub fn op_position(self) -> Option<(usize, SignalOp)> {
        match self {
            DeviceCall::PutSignalBlock { op, .. } => Some((5, op)),
            DeviceCall::SignalOp { op } => Some((2, op)),
            _ => None,
        }
    }
}

impl Vendor {
    /// The device function's name in the vendor library (ROCSHMEM's as its API documentation
    /// spells them; not yet checked against its bitcode, which is not on this project's machines).
    pub fn function(self, call: DeviceCall) -> &'static str {
        match (self, call) {
            (Vendor::Nvshmem, DeviceCall::PutBlock { nbi: false }) => "nvshmemx_putmem_block",
            (Vendor::Nvshmem, DeviceCall::PutBlock { nbi: true }) => "nvshmemx_putmem_nbi_block",
            (Vendor::Nvshmem, DeviceCall::GetBlock { nbi: false }) => "nvshmemx_getmem_block",
            (Vendor::Nvshmem, DeviceCall::GetBlock { nbi: true }) => "nvshmemx_getmem_nbi_block",
            (Vendor::Nvshmem, DeviceCall::PutSignalBlock { nbi: false, .. }) => "nvshmemx_putmem_signal_block",
            (Vendor::Nvshmem, DeviceCall::PutSignalBlock { nbi: true, .. }) => "nvshmemx_putmem_signal_nbi_block",
            (Vendor::Nvshmem, DeviceCall::SignalOp { .. }) => "nvshmemx_signal_op",
            (Vendor::Nvshmem, DeviceCall::Fence) => "nvshmem_fence",
            (Vendor::Nvshmem, DeviceCall::Quiet) => "nvshmem_quiet",
            (Vendor::Rocshmem, DeviceCall::PutBlock { nbi: false }) => "rocshmem_putmem_wg",
            (Vendor::Rocshmem, DeviceCall::PutBlock { nbi: true }) => "rocshmem_putmem_nbi_wg",
            (Vendor::Rocshmem, DeviceCall::GetBlock { nbi: false }) => "rocshmem_getmem_wg",
            (Vendor::Rocshmem, DeviceCall::GetBlock { nbi: true }) => "rocshmem_getmem_nbi_wg",
            (Vendor::Rocshmem, DeviceCall::PutSignalBlock { nbi: false, .. }) => "rocshmem_putmem_signal_wg",
            (Vendor::Rocshmem, DeviceCall::PutSignalBlock { nbi: true, .. }) => "rocshmem_putmem_signal_nbi_wg",
            (Vendor::Rocshmem, DeviceCall::SignalOp { .. }) => "rocshmem_signal_op",
            (Vendor::Rocshmem, DeviceCall::Fence) => "rocshmem_fence",
            (Vendor::Rocshmem, DeviceCall::Quiet) => "rocshmem_quiet",
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
    fn device_calls_have_one_parameter_per_operand_plus_the_signal_operation() {
        for c in DeviceCall::ALL {
            let extra = usize::from(c.op_position().is_some());
            assert_eq!(c.params().len(), c.operands() + extra, "{c:?}");
            if let Some((at, _)) = c.op_position() {
                assert_eq!(c.params()[at], CallParam::I32, "{c:?}");
            }
            assert!(Vendor::Nvshmem.function(c).starts_with("nvshmem"));
            assert!(Vendor::Rocshmem.function(c).starts_with("rocshmem"));
        }
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
