//! Code objects from LLVM IR with LLVM 19's `llc` and `ld.lld`, found at run time (no LLVM at
//! build time): `TRIDENT_LLVM_DIR` (a folder holding `llc` and `ld.lld`), else `llc-19` /
//! `ld.lld-19` on the PATH, else `llc` / `ld.lld` when they say they are version 19 or newer.
//! Results are cached on disk by a hash of the IR, the target and the tools' version.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What could not be done, in words a user can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodeObjectError {
    #[error(
        "LLVM 19 or newer (llc and ld.lld) not found: install Debian's llvm-19 and lld-19, or set TRIDENT_LLVM_DIR to a folder holding llc and ld.lld ({0})"
    )]
    NoTools(String),
    #[error("{tool} failed on kernel `{kernel}` for {cpu}: {message}")]
    Tool { tool: &'static str, kernel: String, cpu: String, message: String },
    #[error("{0}")]
    Io(String),
}

/// The tools in use and their version line.
#[derive(Clone, Debug)]
pub struct Tools {
    pub llc: PathBuf,
    pub lld: PathBuf,
    pub version: String,
}

fn version_of(tool: &Path) -> Option<(u32, String)> {
    let out = Command::new(tool).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text.lines().find(|l| l.contains("version"))?.trim().to_string();
    let major = line.split("version").nth(1)?.trim().split(['.', ' ']).next()?.parse::<u32>().ok()?;
    Some((major, line))
}

/// Finds `llc` and `ld.lld` of LLVM 19 or newer (looked up once per process and value of
/// `TRIDENT_LLVM_DIR`: asking the tools their version costs two process starts).
pub fn tools() -> Result<Tools, CodeObjectError> {
    type Found = (Option<std::ffi::OsString>, Result<Tools, CodeObjectError>);
    static FOUND: std::sync::Mutex<Option<Found>> = std::sync::Mutex::new(None);
    let dir = std::env::var_os("TRIDENT_LLVM_DIR");
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((d, r)) = found.as_ref() {
        if *d == dir {
            return r.clone();
        }
    }
    let r = find_tools();
    *found = Some((dir, r.clone()));
    r
}

fn find_tools() -> Result<Tools, CodeObjectError> {
    let mut tried = Vec::new();
    let candidates: Vec<(PathBuf, PathBuf)> = match std::env::var_os("TRIDENT_LLVM_DIR") {
        Some(d) => {
            let d = PathBuf::from(d);
            vec![(d.join("llc"), d.join("ld.lld"))]
        }
        None => vec![
            (PathBuf::from("llc-19"), PathBuf::from("ld.lld-19")),
            (PathBuf::from("llc-20"), PathBuf::from("ld.lld-20")),
            (PathBuf::from("llc"), PathBuf::from("ld.lld")),
        ],
    };
    for (llc, lld) in candidates {
        match version_of(&llc) {
            Some((major, line)) if major >= 19 => {
                if Command::new(&lld).arg("--version").output().is_ok_and(|o| o.status.success()) {
                    return Ok(Tools { llc, lld, version: line });
                }
                tried.push(format!("{} found but {} is missing", llc.display(), lld.display()));
            }
            Some((major, _)) => tried.push(format!("{} is LLVM {major}", llc.display())),
            None => tried.push(format!("no {}", llc.display())),
        }
    }
    Err(CodeObjectError::NoTools(tried.join("; ")))
}

fn cache_dir() -> PathBuf {
    std::env::var_os("TRIDENT_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/trident")))
        .unwrap_or_else(std::env::temp_dir)
        .join("amd-code-objects")
}

/// FNV-1a over the bytes: a cache key, not a security boundary.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for &b in *p {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The code object (an ELF `.hsaco`) of `ir` for `cpu`: `llc -O3` to a relocatable object, then
/// `ld.lld -shared --no-undefined` (an intrinsic LLVM does not know becomes an undefined symbol:
/// refused here, not at load time).
pub fn code_object(tools: &Tools, ir: &str, kernel: &str, cpu: &str) -> Result<Vec<u8>, CodeObjectError> {
    build(tools, ir, kernel, cpu, true)
}

/// [`code_object`] without reading the cache (to time `llc` and `ld.lld`).
pub fn code_object_uncached(tools: &Tools, ir: &str, kernel: &str, cpu: &str) -> Result<Vec<u8>, CodeObjectError> {
    build(tools, ir, kernel, cpu, false)
}

fn build(tools: &Tools, ir: &str, kernel: &str, cpu: &str, use_cache: bool) -> Result<Vec<u8>, CodeObjectError> {
    let key = fnv(&[ir.as_bytes(), cpu.as_bytes(), tools.version.as_bytes()]);
    let dir = cache_dir();
    let cached = dir.join(format!("{kernel}-{cpu}-{key:016x}.hsaco"));
    if use_cache {
        if let Ok(bytes) = std::fs::read(&cached) {
            return Ok(bytes);
        }
    }
    let io = |e: std::io::Error| CodeObjectError::Io(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(&dir).map_err(io)?;
    // Files of this build alone: threads of one process (`trident test --jobs`) may build the
    // same kernel at once, and one's clean-up must not remove the other's object before its link.
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let build = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stem = format!("{kernel}-{cpu}-{key:016x}-{}-{build}", std::process::id());
    let file = |ext: &str| dir.join(format!("{stem}.{ext}"));
    let (ll, obj, so) = (file("ll"), file("o"), file("so"));
    std::fs::write(&ll, ir).map_err(io)?;
    let run = |tool: &'static str, cmd: &mut Command| -> Result<(), CodeObjectError> {
        let out = cmd.output().map_err(|e| CodeObjectError::Io(format!("{tool}: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            let message = String::from_utf8_lossy(&out.stderr).lines().take(12).collect::<Vec<_>>().join("\n");
            Err(CodeObjectError::Tool { tool, kernel: kernel.to_string(), cpu: cpu.to_string(), message })
        }
    };
    let r = run(
        "llc",
        Command::new(&tools.llc)
            .args(["-O3", "-mtriple=amdgcn-amd-amdhsa"])
            .arg(format!("-mcpu={cpu}"))
            .args(["-filetype=obj", "-o"])
            .arg(&obj)
            .arg(&ll),
    )
    .and_then(|()| {
        run("ld.lld", Command::new(&tools.lld).args(["-shared", "--no-undefined", "-o"]).arg(&so).arg(&obj))
    });
    let bytes = r.and_then(|()| std::fs::read(&so).map_err(io));
    for f in [&ll, &obj] {
        let _ = std::fs::remove_file(f);
    }
    let bytes = bytes?;
    let _ = std::fs::rename(&so, &cached);
    Ok(bytes)
}

/// The disassembly of a code object (`llvm-objdump -d`, next to `llc`), for `--asm` and the
/// golden ISA checks.
pub fn disassemble(tools: &Tools, code: &[u8], cpu: &str) -> Result<String, CodeObjectError> {
    let objdump = {
        let name = tools.llc.file_name().and_then(|n| n.to_str()).unwrap_or("llc").replace("llc", "llvm-objdump");
        tools.llc.with_file_name(name)
    };
    let path = std::env::temp_dir().join(format!("trident-{}-{:016x}.hsaco", std::process::id(), fnv(&[code])));
    std::fs::write(&path, code).map_err(|e| CodeObjectError::Io(e.to_string()))?;
    let out = Command::new(&objdump)
        .args(["-d", "--triple=amdgcn-amd-amdhsa"])
        .arg(format!("--mcpu={cpu}"))
        .arg(&path)
        .output()
        .map_err(|e| CodeObjectError::Io(format!("{}: {e}", objdump.display())));
    let _ = std::fs::remove_file(&path);
    let out = out?;
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}
