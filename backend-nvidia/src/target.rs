//! NVIDIA targets by name, and their descriptions (`trident_core::target`) registered for the
//! shared lowering and `cpu-simt`.

use trident_core::target::{TargetDesc, SM_80, SM_90, SM_90A};

inventory::submit! { SM_80 }
inventory::submit! { SM_90 }
inventory::submit! { SM_90A }

/// A compute capability the PTX writer targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Sm80,
    Sm90,
    /// Hopper with the architecture-specific features (`wgmma`, `setmaxnreg`).
    Sm90a,
}

impl Target {
    pub const NAMES: &'static [&'static str] = &["sm_90a", "sm_90", "sm_80"];

    pub fn lookup(name: &str) -> Option<Target> {
        match name {
            "sm_80" => Some(Target::Sm80),
            "sm_90" => Some(Target::Sm90),
            "sm_90a" => Some(Target::Sm90a),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Target::Sm80 => "sm_80",
            Target::Sm90 => "sm_90",
            Target::Sm90a => "sm_90a",
        }
    }

    /// What the shared lowering knows about it.
    pub fn desc(self) -> &'static TargetDesc {
        match self {
            Target::Sm80 => &SM_80,
            Target::Sm90 => &SM_90,
            Target::Sm90a => &SM_90A,
        }
    }

    /// PTX ISA version emitted: 8.0 is the first with `sm_90a` and is accepted by CUDA 12.0+
    /// drivers (the test machine's CUDA 13.0 driver JIT accepts up to 9.0).
    pub fn ptx_version(self) -> &'static str {
        "8.0"
    }
}
