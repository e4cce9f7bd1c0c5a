//! NVSHMEM's host library, loaded at run time with `libloading` (no NVSHMEM at build time, none
//! shipped): unique-id bootstrap, symmetric allocations, peer addresses.
//!
//! Only the exported `nvshmemx_hostlib_*` entry points are used (`nvshmem_init` and
//! `nvshmemx_init_attr` are inline in NVSHMEM's headers, not exported); the version words of
//! the structures those headers initialise are filled here (`../shared/SHMEM.md`). The library
//! is looked for, in order, at `$TRIDENT_NVSHMEM_LIB` (the file), `$NVSHMEM_HOME/lib`, the
//! `nvidia/nvshmem/lib` of the Python environments of `$VIRTUAL_ENV`, `$CONDA_PREFIX` and every
//! `python3` on `$PATH` (the `nvidia-nvshmem-cu12/cu13` wheels), then the loader's own path.
//! Every failure is a typed [`NvshmemError`] naming what was looked for and found.

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};

/// The host library's file name (NVSHMEM 3).
pub const HOST_LIBRARY: &str = "libnvshmem_host.so.3";

/// Why NVSHMEM cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NvshmemError {
    #[error("NVSHMEM host library not found (looked at: {tried}); install the `nvidia-nvshmem-cu13` wheel or set NVSHMEM_HOME or TRIDENT_NVSHMEM_LIB")]
    NotFound { tried: String },
    #[error("NVSHMEM host library {path}: {message}")]
    Load { path: String, message: String },
    #[error("NVSHMEM {found} at {path}: trident needs NVSHMEM 3")]
    Version { found: String, path: String },
    #[error("NVSHMEM {call} failed with status {status}{hint}")]
    Call { call: &'static str, status: i32, hint: String },
}

/// `nvshmemx_uniqueid_t`: 128 bytes, its first word the version `(1 << 16) + 128`.
pub const UNIQUE_ID_BYTES: usize = 128;
const UNIQUE_ID_VERSION: i32 = (1 << 16) + 128;
/// `nvshmemx_init_attr_t` (144 bytes): version `(2 << 16) + 144` at 0, `mpi_comm` at 8, the
/// init arguments (128 bytes, version `(2 << 16) + 128`) at 16, whose unique-id arguments
/// (version `(1 << 16) + 24`) start at 24; `nvshmemx_set_attr_uniqueid_args` fills the rest.
const INIT_ATTR_BYTES: usize = 144;
const INIT_ATTR_VERSION: i32 = (2 << 16) + 144;
const INIT_ARGS_VERSION: i32 = (2 << 16) + 128;
const UNIQUE_ID_ARGS_VERSION: i32 = (1 << 16) + 24;
/// `NVSHMEMX_INIT_WITH_UNIQUEID`.
const INIT_WITH_UNIQUEID: u32 = 1 << 3;

type GetUniqueId = unsafe extern "C" fn(*mut c_void) -> c_int;
type SetUniqueIdArgs = unsafe extern "C" fn(c_int, c_int, *const c_void, *mut c_void) -> c_int;
type HostlibInit = unsafe extern "C" fn(u32, *mut c_void) -> c_int;
type Finalize = unsafe extern "C" fn();
type Malloc = unsafe extern "C" fn(usize) -> *mut c_void;
type Free = unsafe extern "C" fn(*mut c_void);
type Ptr = unsafe extern "C" fn(*const c_void, c_int) -> *mut c_void;
type Pe = unsafe extern "C" fn() -> c_int;
type VersionInfo = unsafe extern "C" fn(*mut c_int, *mut c_int, *mut c_int);
type CumoduleInit = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `dlopen`'s flag that only looks for a library already loaded.
const RTLD_NOLOAD: std::ffi::c_int = 0x4;

/// The loaded host library.
pub struct Nvshmem {
    _lib: libloading::Library,
    pub path: PathBuf,
    /// `major.minor.patch` as the library reports it.
    pub version: String,
    get_unique_id: GetUniqueId,
    set_unique_id_args: SetUniqueIdArgs,
    hostlib_init: HostlibInit,
    hostlib_finalize: Finalize,
    malloc: Malloc,
    free: Free,
    ptr: Ptr,
    my_pe: Pe,
    n_pes: Pe,
    cumodule_init: CumoduleInit,
    /// `nvshmemx_init_status`, where the library has it.
    init_status: Option<Pe>,
}

/// Where the host library may be, in search order (existing files and bare names to hand to
/// the loader).
pub fn candidates(var: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(f) = var("TRIDENT_NVSHMEM_LIB") {
        out.push(PathBuf::from(f));
    }
    if let Some(h) = var("NVSHMEM_HOME") {
        out.push(Path::new(&h).join("lib").join(HOST_LIBRARY));
    }
    let mut prefixes: Vec<PathBuf> =
        ["VIRTUAL_ENV", "CONDA_PREFIX"].iter().filter_map(|v| var(v)).map(PathBuf::from).collect();
    for dir in var("PATH").unwrap_or_default().split(':').filter(|d| !d.is_empty()) {
        if Path::new(dir).join("python3").exists() {
            if let Some(prefix) = Path::new(dir).parent() {
                prefixes.push(prefix.to_path_buf());
            }
        }
    }
    for prefix in prefixes {
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else { continue };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python3")))
            .collect();
        pythons.sort();
        for py in pythons {
            let f = py.join("site-packages/nvidia/nvshmem/lib").join(HOST_LIBRARY);
            if f.exists() && !out.contains(&f) {
                out.push(f);
            }
        }
    }
    out.push(PathBuf::from(HOST_LIBRARY));
    out
}

impl Nvshmem {
    /// The host library this process has loaded already (torch loads it for its symmetric
    /// memory), else the first of [`candidates`] that loads: one process never holds two
    /// NVSHMEMs.
    pub fn open() -> Result<Nvshmem, NvshmemError> {
        // SAFETY: RTLD_NOLOAD loads nothing: it returns the library if the process has it.
        let loaded = unsafe {
            libloading::os::unix::Library::open(
                Some(HOST_LIBRARY),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL | RTLD_NOLOAD,
            )
        };
        if let Ok(lib) = loaded {
            return Self::bind(
                libloading::Library::from(lib),
                PathBuf::from(format!("{HOST_LIBRARY} (already loaded)")),
            );
        }
        Self::open_from(&candidates(&|k| std::env::var(k).ok()))
    }

    /// Whether NVSHMEM is initialised in this process already (by torch, or another library):
    /// then it is used as it is, not initialised again.
    pub fn initialized(&self) -> bool {
        // SAFETY: a plain query, valid before and after init.
        let status = self.init_status.map_or(0, |f| unsafe { f() });
        // NVSHMEM_STATUS_IS_INITIALIZED (2), LIMITED_MPG, FULL_MPG; INVALID is INT_MAX.
        (2..=4).contains(&status)
    }

    /// This PE and the number of PEs (after init).
    pub fn pe(&self) -> (usize, usize) {
        // SAFETY: plain queries after init.
        let (me, n) = unsafe { ((self.my_pe)(), (self.n_pes)()) };
        (me.max(0) as usize, n.max(0) as usize)
    }

    /// Loads the first of `list` that loads: a path that exists and does not load as an
    /// NVSHMEM 3 host library is an error naming it, not skipped.
    pub fn open_from(list: &[PathBuf]) -> Result<Nvshmem, NvshmemError> {
        let mut tried = Vec::new();
        for path in list {
            let explicit = path.components().count() > 1;
            if explicit && !path.exists() {
                tried.push(format!("{} (absent)", path.display()));
                continue;
            }
            // RTLD_GLOBAL: NVSHMEM's transports and its device-side symbols resolve against it.
            // SAFETY: loading a shared library runs its initialisers; NVSHMEM's only set up
            // its own state.
            let lib = unsafe {
                libloading::os::unix::Library::open(
                    Some(path),
                    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
                )
            };
            match lib {
                Ok(lib) => return Self::bind(libloading::Library::from(lib), path.clone()),
                Err(e) if explicit => {
                    return Err(NvshmemError::Load { path: path.display().to_string(), message: e.to_string() })
                }
                Err(_) => tried.push(format!("{} (not on the loader's path)", path.display())),
            }
        }
        Err(NvshmemError::NotFound { tried: tried.join(", ") })
    }

    fn bind(lib: libloading::Library, path: PathBuf) -> Result<Nvshmem, NvshmemError> {
        let shown = path.display().to_string();
        let missing = |name: &str, e: libloading::Error| NvshmemError::Load {
            path: shown.clone(),
            message: format!("no `{name}` ({e}): not an NVSHMEM 3 host library"),
        };
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol's type is the one NVSHMEM 3's headers declare for it.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| missing($name, e))?
            };
        }
        let version_info: VersionInfo = sym!("nvshmemx_vendor_get_version_info");
        let (mut major, mut minor, mut patch) = (0, 0, 0);
        // SAFETY: three out-parameters of the declared type.
        unsafe { version_info(&mut major, &mut minor, &mut patch) };
        let version = format!("{major}.{minor}.{patch}");
        if major != 3 {
            return Err(NvshmemError::Version { found: version, path: shown });
        }
        Ok(Nvshmem {
            get_unique_id: sym!("nvshmemx_get_uniqueid"),
            set_unique_id_args: sym!("nvshmemx_set_attr_uniqueid_args"),
            hostlib_init: sym!("nvshmemx_hostlib_init_attr"),
            hostlib_finalize: sym!("nvshmemx_hostlib_finalize"),
            malloc: sym!("nvshmem_malloc"),
            free: sym!("nvshmem_free"),
            ptr: sym!("nvshmem_ptr"),
            my_pe: sym!("nvshmem_my_pe"),
            n_pes: sym!("nvshmem_n_pes"),
            cumodule_init: sym!("nvshmemx_cumodule_init"),
            // SAFETY: the symbol's type is the one NVSHMEM 3's headers declare for it.
            init_status: unsafe { lib.get::<Pe>(b"nvshmemx_init_status\0") }.ok().map(|f| *f),
            _lib: lib,
            path,
            version,
        })
    }

    fn check(call: &'static str, status: c_int, hint: &str) -> Result<(), NvshmemError> {
        if status == 0 {
            Ok(())
        } else {
            Err(NvshmemError::Call { call, status, hint: hint.to_string() })
        }
    }

    /// A fresh unique id (rank 0 makes it; the others receive it through the rendezvous).
    pub fn unique_id(&self) -> Result<[u8; UNIQUE_ID_BYTES], NvshmemError> {
        let mut id = [0u8; UNIQUE_ID_BYTES];
        id[..4].copy_from_slice(&UNIQUE_ID_VERSION.to_le_bytes());
        // SAFETY: `id` is a 128-byte `nvshmemx_uniqueid_t` with its version set.
        let status = unsafe { (self.get_unique_id)(id.as_mut_ptr().cast()) };
        Self::check(
            "nvshmemx_get_uniqueid",
            status,
            " (its bootstrap finds no usable network interface: set NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME, `lo` on one node)",
        )?;
        Ok(id)
    }

    /// Initialises this process as PE `rank` of `size`, all sharing `id`. The calling thread's
    /// current CUDA context is the one NVSHMEM uses. Collective: blocks until every PE called
    /// it (NVSHMEM's bootstrap has no bound; the rendezvous checked beforehand that all ranks
    /// are alive and agree).
    pub fn init(&self, rank: usize, size: usize, id: &[u8; UNIQUE_ID_BYTES]) -> Result<(), NvshmemError> {
        let mut attr = [0u64; INIT_ATTR_BYTES / 8];
        let words: &mut [u8] = bytemuck_words(&mut attr);
        words[0..4].copy_from_slice(&INIT_ATTR_VERSION.to_le_bytes());
        words[16..20].copy_from_slice(&INIT_ARGS_VERSION.to_le_bytes());
        words[24..28].copy_from_slice(&UNIQUE_ID_ARGS_VERSION.to_le_bytes());
        // SAFETY: `attr` is a zeroed, 8-aligned `nvshmemx_init_attr_t` with its version words
        // set; `id` outlives the init call that reads it through the pointer stored here.
        let status = unsafe {
            (self.set_unique_id_args)(rank as c_int, size as c_int, id.as_ptr().cast(), attr.as_mut_ptr().cast())
        };
        Self::check("nvshmemx_set_attr_uniqueid_args", status, "")?;
        // SAFETY: as above; the flag says which arguments are set.
        let status = unsafe { (self.hostlib_init)(INIT_WITH_UNIQUEID, attr.as_mut_ptr().cast()) };
        Self::check("nvshmemx_hostlib_init_attr", status, " (NVSHMEM_DEBUG=INFO says why)")?;
        // SAFETY: plain queries after a successful init.
        let (me, n) = unsafe { ((self.my_pe)(), (self.n_pes)()) };
        if me as usize != rank || n as usize != size {
            return Err(NvshmemError::Call {
                call: "nvshmemx_hostlib_init_attr",
                status: 0,
                hint: format!(": made PE {me} of {n}, asked for rank {rank} of {size}"),
            });
        }
        Ok(())
    }

    /// `bytes` of symmetric memory (collective: every PE asks the same size in the same order).
    pub fn malloc(&self, bytes: usize) -> Result<u64, NvshmemError> {
        // SAFETY: a collective allocation after init.
        let p = unsafe { (self.malloc)(bytes) };
        if p.is_null() {
            return Err(NvshmemError::Call {
                call: "nvshmem_malloc",
                status: -1,
                hint: format!(" for {bytes} bytes (NVSHMEM_SYMMETRIC_SIZE bounds the heap)"),
            });
        }
        Ok(p as u64)
    }

    /// Releases a symmetric allocation (collective).
    pub fn free(&self, address: u64) {
        // SAFETY: `address` came from `malloc`.
        unsafe { (self.free)(address as *mut c_void) }
    }

    /// Where this process reaches `pe`'s copy of the symmetric address `address` by load and
    /// store, or `None` where it cannot (another node).
    pub fn peer(&self, address: u64, pe: usize) -> Option<u64> {
        // SAFETY: a query on a symmetric address.
        let p = unsafe { (self.ptr)(address as *const c_void, pe as c_int) };
        (!p.is_null()).then_some(p as u64)
    }

    /// Registers a loaded module that links NVSHMEM's device functions (`CUmodule`).
    ///
    /// # Safety
    /// `module` is a module loaded in the current context, after `init`.
    pub unsafe fn cumodule_init(&self, module: *mut c_void) -> Result<(), NvshmemError> {
        // SAFETY: the caller's contract.
        Self::check("nvshmemx_cumodule_init", unsafe { (self.cumodule_init)(module) }, "")
    }

    /// Ends this PE's NVSHMEM (collective).
    pub fn finalize(&self) {
        // SAFETY: after a successful init, once.
        unsafe { (self.hostlib_finalize)() }
    }
}

/// The bytes of an array of 64-bit words.
fn bytemuck_words(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: u64 has no padding and any byte pattern is a valid u64; the length covers the
    // same memory.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), words.len() * 8) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_order_is_variable_then_home_then_python_then_loader() {
        let dir = std::env::temp_dir().join(format!("trident-nvshmem-{}", std::process::id()));
        let lib = dir.join("venv/lib/python3.12/site-packages/nvidia/nvshmem/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(dir.join("venv/bin")).unwrap();
        std::fs::write(dir.join("venv/bin/python3"), "").unwrap();
        std::fs::write(lib.join(HOST_LIBRARY), "").unwrap();
        let path = format!("/nonexistent:{}", dir.join("venv/bin").display());
        let var = |k: &str| match k {
            "TRIDENT_NVSHMEM_LIB" => Some("/x/libnvshmem_host.so.3".to_string()),
            "NVSHMEM_HOME" => Some("/opt/nvshmem".to_string()),
            "PATH" => Some(path.clone()),
            _ => None,
        };
        let c = candidates(&var);
        assert_eq!(c[0], PathBuf::from("/x/libnvshmem_host.so.3"));
        assert_eq!(c[1], PathBuf::from("/opt/nvshmem/lib").join(HOST_LIBRARY));
        assert_eq!(c[2], lib.join(HOST_LIBRARY));
        assert_eq!(c.last().unwrap(), &PathBuf::from(HOST_LIBRARY));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_library_absent_or_not_nvshmem_is_a_typed_error() {
        let dir = std::env::temp_dir().join(format!("trident-nvshmem-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let absent = [dir.join("none").join(HOST_LIBRARY), PathBuf::from("libtrident-no-such-nvshmem.so.3")];
        let e = Nvshmem::open_from(&absent).err().unwrap();
        assert!(matches!(e, NvshmemError::NotFound { .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains("(absent)") && text.contains("libtrident-no-such-nvshmem.so.3"), "{text}");
        let bad = dir.join(HOST_LIBRARY);
        std::fs::write(&bad, "not an ELF file").unwrap();
        let e = Nvshmem::open_from(std::slice::from_ref(&bad)).err().unwrap();
        assert!(matches!(&e, NvshmemError::Load { path, .. } if path == &bad.display().to_string()), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
