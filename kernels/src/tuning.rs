//! The GEMM's tuning cache: the configuration that measured fastest for a device, an element
//! type and a problem shape, kept as JSON in the user's cache directory
//! (`$TRIDENT_CACHE_DIR`, else `~/.cache/trident`, file `gemm-tuning.json`). `trident bench`
//! fills it: its sweep times every configuration on the GPU and records the winner.
//! [`Gemm::tuned`](crate::gemm::Gemm::tuned) reads it, falls back on the per-target heuristic
//! (`Gemm::for_problem`) for shapes never tuned, and says once per shape which it took.
//!
//! The file is read whole and written whole (through a temporary file renamed over it), so a
//! reader never sees half an update; two writers at once keep one of their updates. An entry
//! that does not parse, or a file that is not JSON, is ignored with a message, never an error:
//! the cache only ever makes a faster choice.

use crate::gemm::Gemm;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use trident_core::ir::DType;

/// A tuned configuration and what it measured.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmChoice {
    pub block_m: u32,
    pub block_n: u32,
    pub block_k: u32,
    pub warps: u32,
    pub stages: u32,
    pub descriptors: bool,
    pub warp_specialize: bool,
    pub persistent: bool,
    #[serde(default)]
    pub tma_store: bool,
    /// The median time measured (ms).
    pub ms: f64,
}

impl GemmChoice {
    pub fn of(g: &Gemm, ms: f64) -> GemmChoice {
        GemmChoice {
            block_m: g.block_m,
            block_n: g.block_n,
            block_k: g.block_k,
            warps: g.warps,
            stages: g.stages,
            descriptors: g.descriptors,
            warp_specialize: g.warp_specialize,
            persistent: g.persistent,
            tma_store: g.tma_store,
            ms,
        }
    }

    /// `base` with this configuration.
    pub fn apply(&self, base: Gemm) -> Gemm {
        Gemm {
            block_m: self.block_m,
            block_n: self.block_n,
            block_k: self.block_k,
            warps: self.warps,
            stages: self.stages,
            descriptors: self.descriptors,
            warp_specialize: self.warp_specialize,
            persistent: self.persistent,
            tma_store: self.tma_store,
            ..base
        }
    }
}

/// The cache key of a GEMM of `m x n x k` in `dtype` on `device`.
pub fn key(device: &str, dtype: DType, (m, n, k): (usize, usize, usize)) -> String {
    format!("{device} | {dtype} | {m}x{n}x{k}")
}

/// The tuning cache file (its entries by [`key`]).
#[derive(Debug, Default)]
pub struct TuningCache {
    pub path: PathBuf,
    pub entries: BTreeMap<String, GemmChoice>,
}

impl TuningCache {
    /// Where the cache lives: `$TRIDENT_CACHE_DIR/gemm-tuning.json`, else under
    /// `~/.cache/trident`.
    pub fn default_path() -> PathBuf {
        trident_core::backend::cache_dir().join("gemm-tuning.json")
    }

    /// The cache at `path`: empty when the file is missing or unreadable (said on stderr when
    /// it exists but does not parse).
    pub fn load(path: PathBuf) -> TuningCache {
        let entries = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                eprintln!("trident: ignoring the GEMM tuning cache {}: {e}", path.display());
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        TuningCache { path, entries }
    }

    pub fn get(&self, key: &str) -> Option<GemmChoice> {
        self.entries.get(key).copied()
    }

    /// Records `choice` for `key` and writes the file (a temporary file renamed over it).
    pub fn record(&mut self, key: String, choice: GemmChoice) -> std::io::Result<()> {
        self.entries.insert(key, choice);
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension(format!("json.{}", std::process::id()));
        let text = serde_json::to_string_pretty(&self.entries).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_round_trip_through_the_file_and_bad_files_are_ignored() {
        let dir = std::env::temp_dir().join(format!("trident-tuning-{}", std::process::id()));
        let path = dir.join("gemm-tuning.json");
        let _ = std::fs::remove_dir_all(&dir);
        let g = Gemm {
            block_m: 64,
            block_n: 128,
            block_k: 128,
            stages: 4,
            warp_specialize: true,
            ..Gemm::new(DType::BF16)
        };
        let k = key("NVIDIA H200", DType::BF16, (128, 8192, 8192));
        let mut c = TuningCache::load(path.clone());
        assert!(c.get(&k).is_none());
        c.record(k.clone(), GemmChoice::of(&g, 0.058)).unwrap();
        let back = TuningCache::load(path.clone());
        let got = back.get(&k).expect("recorded");
        assert_eq!(got.apply(Gemm::new(DType::BF16)), g);
        assert_eq!(got.ms, 0.058);
        assert!(back.get(&key("NVIDIA H200", DType::F16, (128, 8192, 8192))).is_none());
        std::fs::write(&path, "not json").unwrap();
        assert!(TuningCache::load(path).entries.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
