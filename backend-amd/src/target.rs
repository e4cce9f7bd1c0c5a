//! AMD targets: their descriptions (`trident_core::target`) registered for the shared lowering.

use trident_core::target::{GFX90A, GFX942};

inventory::submit! { GFX942 }
inventory::submit! { GFX90A }

/// The targets this crate registers, preferred first.
pub const NAMES: &[&str] = &["gfx942", "gfx90a"];
