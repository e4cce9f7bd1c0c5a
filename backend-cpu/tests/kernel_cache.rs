//! The kernel cache keys artifacts by backend and target as well as by the kernel's key: a
//! launcher whose target changes compiles again instead of launching another target's code.

use trident_backend_cpu::simt_exec::SimtBackend;
use trident_core::ir::{DType, LaunchAttrs};
use trident_core::world::KernelCache;
use trident_core::KernelBuilder;

#[test]
fn artifacts_are_cached_per_target() {
    trident_backend_nvidia::link();
    trident_backend_amd::link();
    trident_backend_cpu::simt_exec::link();
    let build = || {
        let b = KernelBuilder::new("copy", LaunchAttrs::default());
        let (x, y) = (b.arg_ptr("x", DType::F32), b.arg_ptr("y", DType::F32));
        let i = b.arange(0, 128);
        b.store(y + i, b.load(x + i, None, None), None);
        b.finish()
    };
    let cache = KernelCache::default();
    let a = cache.get_or_compile(&SimtBackend, Some("sm_90a"), "copy", &build).unwrap();
    let b = cache.get_or_compile(&SimtBackend, Some("gfx942"), "copy", &build).unwrap();
    assert_eq!((a.target.as_str(), b.target.as_str()), ("sm_90a", "gfx942"));
    let again = cache.get_or_compile(&SimtBackend, Some("sm_90a"), "copy", &|| panic!("compiled twice")).unwrap();
    assert_eq!(again.target, "sm_90a");
}
