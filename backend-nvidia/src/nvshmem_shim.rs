//! The NVSHMEM device shim: the device functions trident's inter-node lowering calls
//! (`DeviceCall`, `Vendor::Nvshmem`), made from the installed NVSHMEM's own device bitcode with
//! LLVM tools, as PTX the driver's JIT linker links into every module that calls them
//! (`CudaDevice::load_linked`). No NVSHMEM code ships inside trident.
//!
//! NVSHMEM's device functions are inline in its headers; its `libnvshmem_device.bc` defines them
//! (LLVM 18 bitcode in 3.4.5, which CUDA 13's libNVVM cannot read: `../shared/SHMEM.md`). A stub
//! module declares and calls each function, `llvm-link --only-needed` pulls their definitions
//! (and NVSHMEM's device state) out of the bitcode, `opt -O3` and `llc` make PTX. The result is
//! cached by NVSHMEM version and architecture in `<cache>/nvshmem-shim/<version>/<arch>.ptx`
//! (`trident_core::backend::cache_dir`); `TRIDENT_NVSHMEM_SHIM` names a shim file directly.
//! `cargo xtask nvshmem-shim` makes the cache entry on a machine with the tools, to carry to a
//! GPU machine without them; the runtime makes it itself where it finds both.

use std::path::{Path, PathBuf};
use std::process::Command;
use trident_core::ir::{CallParam, DeviceCall, Vendor};

/// Why no shim could be found or made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShimError {
    #[error("no NVSHMEM device shim for NVSHMEM {version} {arch} at {path}, and none can be made here ({why}); make one with `cargo xtask nvshmem-shim --bc .../libnvshmem_device.bc` on a machine with LLVM 18 or newer and copy it there, or set TRIDENT_NVSHMEM_SHIM")]
    Missing { version: String, arch: String, path: String, why: String },
    #[error("making the NVSHMEM shim: `{command}` failed: {message}")]
    Tool { command: String, message: String },
    #[error("NVSHMEM device shim {path}: {message}")]
    Io { path: String, message: String },
}

/// The cache file of the shim for NVSHMEM `version` on `arch` (`sm_90`).
pub fn cache_path(version: &str, arch: &str) -> PathBuf {
    trident_core::backend::cache_dir().join("nvshmem-shim").join(version).join(format!("{arch}.ptx"))
}

/// The PTX architecture a shim for `target` is made for (`sm_90a` uses the `sm_90` shim).
pub fn arch_of(target: &str) -> String {
    target.trim_end_matches('a').to_string()
}

/// The stub module: every device function declared with its C signature and called once, so
/// that `--only-needed` keeps exactly these.
pub fn stub_module() -> String {
    let ty = |p: &CallParam| match p {
        CallParam::Ptr => "ptr",
        CallParam::U64 => "i64",
        CallParam::I32 => "i32",
    };
    let mut decls = Vec::new();
    let mut calls = Vec::new();
    let mut seen = Vec::new();
    for call in DeviceCall::ALL {
        let name = Vendor::Nvshmem.function(call);
        if seen.contains(&name) {
            continue;
        }
        seen.push(name);
        let params: Vec<&str> = call.params().iter().map(ty).collect();
        decls.push(format!("declare void @{name}({})", params.join(", ")));
        let args: Vec<String> = params
            .iter()
            .map(|t| match *t {
                "ptr" => "ptr null".to_string(),
                t => format!("{t} 0"),
            })
            .collect();
        calls.push(format!("  call void @{name}({})", args.join(", ")));
    }
    format!(
        "target datalayout = \"e-i64:64-i128:128-v16:16-v32:32-n16:32:64\"\ntarget triple = \"nvptx64-nvidia-cuda\"\n{}\ndefine void @trident_shim_keep() {{\n{}\n  ret void\n}}\n",
        decls.join("\n"),
        calls.join("\n")
    )
}

/// The LLVM tool `name` (`llvm-link`, `opt`, `llc`): in `$TRIDENT_LLVM_BIN`, else the first of
/// `name-21` .. `name-18`, then `name`, that runs.
pub fn llvm_tool(name: &str) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TRIDENT_LLVM_BIN") {
        let p = Path::new(&dir).join(name);
        return p.exists().then_some(p);
    }
    let versioned = (18..=21).rev().map(|v| format!("{name}-{v}"));
    versioned.chain([name.to_string()]).map(PathBuf::from).find(|p| {
        Command::new(p).arg("--version").output().is_ok_and(|o| {
            let text = String::from_utf8_lossy(&o.stdout).to_string();
            o.status.success() && llvm_major(&text).is_some_and(|m| m >= 18)
        })
    })
}

/// The major version in `llvm-link --version`'s text ("LLVM version 19.1.7").
fn llvm_major(text: &str) -> Option<u32> {
    let after = text.split("LLVM version ").nth(1)?;
    after.split('.').next()?.trim().parse().ok()
}

fn run(cmd: &mut Command) -> Result<std::process::Output, ShimError> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| ShimError::Tool { command: shown.clone(), message: e.to_string() })?;
    if !out.status.success() {
        return Err(ShimError::Tool {
            command: shown,
            message: String::from_utf8_lossy(&out.stderr).lines().take(6).collect::<Vec<_>>().join("; "),
        });
    }
    Ok(out)
}

/// A made shim: its PTX and the NVSHMEM version its bitcode declares.
pub struct Shim {
    pub ptx: String,
    pub version: String,
}

/// Makes the shim from NVSHMEM's device bitcode `bc` for `arch` with the LLVM tools found.
pub fn build(bc: &Path, arch: &str) -> Result<Shim, ShimError> {
    let tool = |n: &str| {
        llvm_tool(n).ok_or_else(|| ShimError::Tool {
            command: n.to_string(),
            message: "no LLVM 18 or newer found (set TRIDENT_LLVM_BIN, or install llvm-19)".into(),
        })
    };
    let (link, opt, llc, dis) = (tool("llvm-link")?, tool("opt")?, tool("llc")?, tool("llvm-dis")?);
    let dir = std::env::temp_dir().join(format!("trident nvshmem-shim-{}", std::process::id()));
    let io =
        |path: &Path, e: std::io::Error| ShimError::Io { path: path.display().to_string(), message: e.to_string() };
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    let made = (|| {
        let stub = dir.join("stub.ll");
        std::fs::write(&stub, stub_module()).map_err(|e| io(&stub, e))?;
        let (linked, optimized, ptx) = (dir.join("shim.bc"), dir.join("shim.opt.bc"), dir.join("shim.ptx"));
        run(Command::new(&link).arg("--only-needed").arg(&stub).arg(bc).arg("-o").arg(&linked))?;
        let text = run(Command::new(&dis).arg(&linked).arg("-o").arg("-"))?;
        let version = device_version(&String::from_utf8_lossy(&text.stdout)).ok_or_else(|| ShimError::Tool {
            command: format!("{dis:?}"),
            message: format!(
                "{} declares no nvshmemi_device_lib_version_d: not NVSHMEM's device bitcode",
                bc.display()
            ),
        })?;
        run(Command::new(&opt).arg("-O3").arg(&linked).arg("-o").arg(&optimized))?;
        run(Command::new(&llc)
            .args(["-O3", &format!("-mcpu={arch}"), "-mattr=+ptx80"])
            .arg(&optimized)
            .arg("-o")
            .arg(&ptx))?;
        let ptx = std::fs::read_to_string(&ptx).map_err(|e| io(&ptx, e))?;
        Ok(Shim { ptx, version })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    made
}

/// The NVSHMEM version of a device module's text (`@nvshmemi_device_lib_version_d = ... { i32 3,
/// i32 4, i32 5 }`).
pub fn device_version(ll: &str) -> Option<String> {
    let line = ll.lines().find(|l| l.starts_with("@nvshmemi_device_lib_version_d"))?;
    let inner = line.split('{').nth(1)?.split('}').next()?;
    let parts: Vec<&str> = inner.split(',').map(|p| p.trim().trim_start_matches("i32").trim()).collect();
    (parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok())).then(|| parts.join("."))
}

/// NVSHMEM's device bitcode: `$TRIDENT_NVSHMEM_BC`, else beside the host library at `host`.
pub fn bitcode_beside(host: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TRIDENT_NVSHMEM_BC") {
        return Some(PathBuf::from(p));
    }
    let p = host.parent()?.join("libnvshmem_device.bc");
    p.exists().then_some(p)
}

/// The shim for NVSHMEM `version` on `arch`: `$TRIDENT_NVSHMEM_SHIM`, else the cache, else made
/// from `bitcode` (and cached) where the LLVM tools are found.
pub fn find_or_build(version: &str, arch: &str, bitcode: Option<&Path>) -> Result<String, ShimError> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|e| ShimError::Io { path: p.display().to_string(), message: e.to_string() })
    };
    if let Some(p) = std::env::var_os("TRIDENT_NVSHMEM_SHIM") {
        return read(Path::new(&p));
    }
    let cached = cache_path(version, arch);
    if cached.exists() {
        return read(&cached);
    }
    let missing = |why: String| ShimError::Missing {
        version: version.to_string(),
        arch: arch.to_string(),
        path: cached.display().to_string(),
        why,
    };
    let bc = bitcode.ok_or_else(|| missing("no libnvshmem_device.bc beside the host library".into()))?;
    if llvm_tool("llvm-link").is_none() {
        return Err(missing("no LLVM 18 or newer on this machine".into()));
    }
    let shim = build(bc, arch)?;
    if shim.version != version {
        return Err(missing(format!("the bitcode is NVSHMEM {}, the host library {version}", shim.version)));
    }
    store(&shim, arch)?;
    Ok(shim.ptx)
}

/// Writes `shim` to its cache path; returns the path.
pub fn store(shim: &Shim, arch: &str) -> Result<PathBuf, ShimError> {
    let path = cache_path(&shim.version, arch);
    let io = |e: std::io::Error| ShimError::Io { path: path.display().to_string(), message: e.to_string() };
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).map_err(io)?;
    std::fs::write(&path, &shim.ptx).map_err(io)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stub_declares_and_calls_every_device_function_once() {
        let stub = stub_module();
        for call in DeviceCall::ALL {
            let name = Vendor::Nvshmem.function(call);
            assert_eq!(stub.matches(&format!("declare void @{name}(")).count(), 1, "{stub}");
            assert_eq!(stub.matches(&format!("call void @{name}(")).count(), 1, "{stub}");
        }
        assert!(stub.contains("declare void @nvshmemx_putmem_signal_block(ptr, ptr, i64, ptr, i64, i32, i32)"));
    }

    #[test]
    fn the_version_comes_from_the_device_state_and_the_cache_is_keyed_by_it() {
        let ll = "@x = global i32 0\n@nvshmemi_device_lib_version_d = dso_local addrspace(4) externally_initialized global %struct.nvshmemi_version_t { i32 3, i32 4, i32 5 }, align 4\n";
        assert_eq!(device_version(ll).as_deref(), Some("3.4.5"));
        assert_eq!(device_version("@y = global i32 0"), None);
        assert!(cache_path("3.4.5", "sm_90").ends_with("nvshmem-shim/3.4.5/sm_90.ptx"));
        assert_eq!(arch_of("sm_90a"), "sm_90");
        assert_eq!(llvm_major("Ubuntu LLVM version 19.1.7\n  Optimized build."), Some(19));
    }

    /// With LLVM here and NVSHMEM's bitcode named by `TRIDENT_NVSHMEM_BC`, the shim is made and
    /// defines every function the lowering calls (skipped, visibly, without them).
    #[test]
    fn a_shim_made_from_the_bitcode_defines_every_device_function() {
        let Some(bc) = std::env::var_os("TRIDENT_NVSHMEM_BC").map(PathBuf::from) else {
            eprintln!("skipped: TRIDENT_NVSHMEM_BC is not set (NVSHMEM's libnvshmem_device.bc)");
            return;
        };
        if llvm_tool("llvm-link").is_none() {
            eprintln!("skipped: no LLVM 18 or newer");
            return;
        }
        let shim = build(&bc, "sm_90").unwrap();
        for call in DeviceCall::ALL {
            let name = Vendor::Nvshmem.function(call);
            assert!(shim.ptx.contains(&format!(".visible .func {name}(")), "{name} not defined");
        }
        assert!(shim.ptx.contains("nvshmemi_device_state_d"));
    }
}
