//! `TRIDENT_LOWERING_ID`: a hash of the sources that decide what PTX a kernel becomes (the
//! shared lowering in `core`, the vocabulary in `shmem-abi`, this crate's PTX writer), for the
//! disk cache's key (`src/ptx_cache.rs`): a build whose lowering differs never reads the PTX
//! another build wrote, whatever the version number says.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let dirs = [here.join("src"), here.join("../core/src"), here.join("../shmem-abi/src")];
    let mut files = Vec::new();
    for d in &dirs {
        println!("cargo:rerun-if-changed={}", d.display());
        sources(d, &mut files);
    }
    files.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in &files {
        f.strip_prefix(&here).unwrap_or(f).hash(&mut h);
        std::fs::read(f).unwrap_or_default().hash(&mut h);
    }
    println!("cargo:rustc-env=TRIDENT_LOWERING_ID={:016x}", h.finish());
}
