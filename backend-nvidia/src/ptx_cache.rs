//! Compiled kernels on disk: the PTX and what the runtime needs beside it (entry, threads,
//! shared memory, waits, tensor maps), keyed by the kernel's IR, the target, trident's version
//! and a hash of the lowering's sources, so that a new process skips the lowering. The second
//! half of a cold start, the driver's JIT of PTX into the GPU's code, is cached by the driver
//! itself (its compute cache, `CUDA_CACHE_PATH`, on by default), keyed by the PTX: the same PTX
//! from this cache hits it.
//!
//! Where: `ptx/` in trident's cache directory (`trident_core::backend::cache_dir`:
//! `$TRIDENT_CACHE_DIR`, else `~/.cache/trident`); `TRIDENT_PTX_CACHE=0` turns it off. An entry
//! holds its whole key, so a hash collision is a miss, never a wrong kernel; entries are written
//! to a temporary file and renamed, so a reader never sees half an entry; a cache that cannot be
//! read or written is skipped silently (the kernel is compiled, as without a cache). Kernels
//! that call NVSHMEM's device functions
//! are not cached (their module is linked at load time anyway).

use crate::PtxModule;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use trident_core::simt::tma::{MapScalar, TensorMap};
use trident_core::{ir::DType, target::TargetDesc, Function};

/// The cache directory, or `None` when it is turned off (`TRIDENT_PTX_CACHE=0`).
pub fn dir() -> Option<PathBuf> {
    match std::env::var("TRIDENT_PTX_CACHE") {
        Ok(v) if v == "0" || v == "off" => None,
        _ => Some(trident_core::backend::cache_dir().join("ptx")),
    }
}

/// The whole key of `func` on `target`: trident's version and the hash of the lowering's
/// sources this build was made from (`build.rs`: a changed lowering with an unchanged version
/// number must not read PTX an earlier build wrote), the target, the IR as text.
fn key(func: &Function, target: &TargetDesc) -> String {
    format!(
        "trident {} lowering {} ptx\ntarget {}\n{}",
        env!("CARGO_PKG_VERSION"),
        env!("TRIDENT_LOWERING_ID"),
        target.name,
        trident_core::text::print(func)
    )
}

fn path(dir: &std::path::Path, key: &str) -> PathBuf {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    dir.join(format!("{:016x}.ptx-entry", h.finish()))
}

fn scalar(s: MapScalar) -> String {
    match s {
        MapScalar::Param(p) => format!("p{p}"),
        MapScalar::Const(c) => format!("c{c}"),
    }
}

fn parse_scalar(s: &str) -> Option<MapScalar> {
    match s.split_at_checked(1)? {
        ("p", p) => p.parse().ok().map(MapScalar::Param),
        ("c", c) => c.parse().ok().map(MapScalar::Const),
        _ => None,
    }
}

/// The entry's text: the key, a line per field and tensor map, then the PTX.
fn write_entry(key: &str, m: &PtxModule) -> String {
    let mut s = format!("{}\n{key}\n", key.len());
    s += &format!(
        "entry {}\nthreads {}\nwaits {}\nprogrammatic {}\nshared {}\n",
        m.entry, m.threads, m.waits as u8, m.programmatic as u8, m.shared_bytes
    );
    for t in &m.tensor_maps {
        s += &format!(
            "map {} {} {} {} {} {} {} {}\n",
            t.ptr,
            t.dtype,
            scalar(t.rows),
            scalar(t.cols),
            scalar(t.row_stride),
            t.box_rows,
            t.box_cols,
            t.swizzle
        );
    }
    s += "ptx\n";
    s += &m.ptx;
    s
}

/// The module an entry holds if its key is `key` (`None`: another key, or not an entry).
fn read_entry(text: &str, key: &str) -> Option<PtxModule> {
    let (len, rest) = text.split_once('\n')?;
    let len: usize = len.parse().ok()?;
    if rest.get(..len)? != key {
        return None;
    }
    let rest = rest.get(len + 1..)?;
    let at = rest.find("\nptx\n")?;
    let (head, ptx) = (&rest[..at], &rest[at + 5..]);
    let mut m = PtxModule {
        id: 0,
        ptx: ptx.to_string(),
        entry: String::new(),
        threads: 0,
        waits: false,
        programmatic: false,
        shared_bytes: 0,
        tensor_maps: Vec::new(),
        device_calls: Vec::new(),
    };
    for line in head.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["entry", e] => m.entry = e.to_string(),
            ["threads", t] => m.threads = t.parse().ok()?,
            ["waits", w] => m.waits = *w == "1",
            ["programmatic", p] => m.programmatic = *p == "1",
            ["shared", s] => m.shared_bytes = s.parse().ok()?,
            ["map", ptr, dtype, rows, cols, stride, br, bc, sw] => m.tensor_maps.push(TensorMap {
                ptr: ptr.parse().ok()?,
                dtype: DType::parse(dtype)?,
                rows: parse_scalar(rows)?,
                cols: parse_scalar(cols)?,
                row_stride: parse_scalar(stride)?,
                box_rows: br.parse().ok()?,
                box_cols: bc.parse().ok()?,
                swizzle: sw.parse().ok()?,
            }),
            _ => return None,
        }
    }
    (!m.entry.is_empty() && m.threads > 0).then_some(m)
}

/// `func`'s module for `target`: from the cache in `dir` when it holds it, else lowered (and
/// stored there). Returns the module and whether it came from the cache.
pub fn lookup_or_lower(
    dir: Option<&std::path::Path>,
    func: &Function,
    target: &'static TargetDesc,
) -> Result<(PtxModule, bool), trident_core::backend::BackendError> {
    let Some(dir) = dir else { return Ok((crate::NvidiaBackend::ptx(func, target)?, false)) };
    let key = key(func, target);
    let file = path(dir, &key);
    if let Some(mut m) = std::fs::read_to_string(&file).ok().and_then(|t| read_entry(&t, &key)) {
        trident_core::verify(func)?;
        m.id = crate::next_module_id();
        return Ok((m, true));
    }
    let m = crate::NvidiaBackend::ptx(func, target)?;
    if m.device_calls.is_empty() && std::fs::create_dir_all(dir).is_ok() {
        let tmp =
            dir.join(format!(".{}.{}", std::process::id(), file.file_name().and_then(|f| f.to_str()).unwrap_or("x")));
        if std::fs::write(&tmp, write_entry(&key, &m)).is_ok() {
            let _ = std::fs::rename(&tmp, &file);
        }
        let _ = std::fs::remove_file(&tmp);
    }
    Ok((m, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gelu() -> Function {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/gelu.tile")).unwrap();
        trident_core::text::parse(&text).unwrap()
    }

    /// A second lookup reads what the first stored, field for field; another target or another
    /// kernel misses; a damaged entry is a miss, not an error.
    #[test]
    fn an_entry_round_trips_and_only_its_key_hits() {
        let dir = std::env::temp_dir().join(format!("trident-ptx-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let sm90a = trident_core::target::lookup("sm_90a").unwrap();
        let sm80 = trident_core::target::lookup("sm_80").unwrap();
        let (a, hit) = lookup_or_lower(Some(&dir), &gelu(), sm90a).unwrap();
        assert!(!hit);
        let (b, hit) = lookup_or_lower(Some(&dir), &gelu(), sm90a).unwrap();
        assert!(hit);
        assert_eq!(
            (&a.ptx, &a.entry, a.threads, a.waits, a.shared_bytes, &a.tensor_maps),
            (&b.ptx, &b.entry, b.threads, b.waits, b.shared_bytes, &b.tensor_maps)
        );
        assert_ne!(a.id, b.id, "every module gets an id of its own");
        let (_, hit) = lookup_or_lower(Some(&dir), &gelu(), sm80).unwrap();
        assert!(!hit, "another target is another entry");
        for f in std::fs::read_dir(&dir).unwrap() {
            std::fs::write(f.unwrap().path(), "7\ngarbage").unwrap();
        }
        let (c, hit) = lookup_or_lower(Some(&dir), &gelu(), sm90a).unwrap();
        assert!(!hit && c.ptx == a.ptx);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The tensor maps of a TMA kernel survive the text form.
    #[test]
    fn tensor_maps_round_trip() {
        let m = TensorMap {
            ptr: 2,
            dtype: DType::BF16,
            rows: MapScalar::Param(5),
            cols: MapScalar::Const(4096),
            row_stride: MapScalar::Param(6),
            box_rows: 64,
            box_cols: 64,
            swizzle: 128,
        };
        let module = PtxModule {
            id: 0,
            ptx: ".version 8.0\nptx\n".into(),
            entry: "k".into(),
            threads: 384,
            waits: true,
            programmatic: true,
            shared_bytes: 200_000,
            tensor_maps: vec![m.clone(), m],
            device_calls: Vec::new(),
        };
        let back = read_entry(&write_entry("KEY", &module), "KEY").unwrap();
        assert_eq!(back.tensor_maps, module.tensor_maps);
        assert_eq!((back.threads, back.waits, back.programmatic, back.shared_bytes), (384, true, true, 200_000));
        assert_eq!(back.ptx, module.ptx, "a PTX text containing `ptx` lines is kept whole");
        assert!(read_entry(&write_entry("KEY", &module), "KEY2").is_none());
    }
}
