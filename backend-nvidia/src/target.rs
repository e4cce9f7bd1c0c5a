//! NVIDIA targets by name.

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

    /// Most shared memory one program may use (bytes, dynamic shared memory opted in):
    /// 227 KiB on Hopper, 163 KiB on A100.
    pub fn shared_limit(self) -> u32 {
        match self {
            Target::Sm80 => 163 << 10,
            Target::Sm90 | Target::Sm90a => 227 << 10,
        }
    }

    /// PTX ISA version emitted: 8.0 is the first with `sm_90a` and is accepted by CUDA 12.0+
    /// drivers (the test machine's CUDA 13.0 driver JIT accepts up to 9.0).
    pub fn ptx_version(self) -> &'static str {
        "8.0"
    }
}
