//! The tuning cache: for any operation, the configuration that measured fastest for a device, a
//! world size, an element type and a problem shape ([`TuningKey`]), kept as JSON in the user's
//! cache directory (`$TRIDENT_CACHE_DIR`, else `~/.cache/trident`, file `tuning.json`).
//! `trident bench` fills it (its GEMM sweep records each shape's winner); operations read it
//! for their configuration (`Gemm::tuned`) and fall back on their heuristic for problems never
//! tuned. An operation's configuration is its own serde type ([`Tuned`] adds the time
//! measured); the cache stores it as JSON under the key's text.
//!
//! The file is read whole and written whole (through a temporary file renamed over it), so a
//! reader never sees half an update; two writers at once keep one of their updates. An entry
//! that does not parse as the configuration asked for, or a file that is not JSON, is ignored
//! with a message, never an error: the cache only ever makes a faster choice.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use trident_core::ir::DType;

/// What a tuned configuration is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TuningKey {
    /// The operation (`gemm`, `ag_gemm`, ...).
    pub op: &'static str,
    /// The device's name as its driver gives it (`NVIDIA H200`).
    pub device: String,
    /// Ranks of the world the operation runs in (1 for single-device operations).
    pub world: usize,
    pub dtype: DType,
    /// The problem's dimensions, as the operation defines them (`M, N, K`).
    pub shape: Vec<usize>,
}

impl TuningKey {
    /// The key's text in the file: `op | device | wW | dtype | 8192x8192x8192`.
    pub fn text(&self) -> String {
        let shape: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        format!("{} | {} | w{} | {} | {}", self.op, self.device, self.world, self.dtype, shape.join("x"))
    }
}

/// A tuned configuration and the median time it measured (ms).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tuned<C> {
    pub config: C,
    pub ms: f64,
}

/// The tuning cache file (its entries by [`TuningKey::text`]).
#[derive(Debug, Default)]
pub struct TuningCache {
    pub path: PathBuf,
    pub entries: BTreeMap<String, serde_json::Value>,
}

impl TuningCache {
    /// Where the cache lives: `$TRIDENT_CACHE_DIR/tuning.json`, else under `~/.cache/trident`.
    pub fn default_path() -> PathBuf {
        trident_core::backend::cache_dir().join("tuning.json")
    }

    /// The cache at `path`: empty when the file is missing or unreadable (said on stderr when
    /// it exists but does not parse).
    pub fn load(path: PathBuf) -> TuningCache {
        let entries = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                eprintln!("trident: ignoring the tuning cache {}: {e}", path.display());
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        TuningCache { path, entries }
    }

    /// The cache at [`TuningCache::default_path`], read once per process (what operations
    /// choose by at run time: a recording is seen by the next process).
    pub fn shared() -> &'static TuningCache {
        static SHARED: std::sync::OnceLock<TuningCache> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| TuningCache::load(TuningCache::default_path()))
    }

    /// The configuration tuned for `key`, if one was recorded and parses as a `C`.
    pub fn get<C: DeserializeOwned>(&self, key: &TuningKey) -> Option<Tuned<C>> {
        let v = self.entries.get(&key.text())?;
        serde_json::from_value(v.clone())
            .map_err(|e| eprintln!("trident: ignoring the tuning cache's entry for {}: {e}", key.text()))
            .ok()
    }

    /// Records `tuned` for `key` and writes the file (a temporary file renamed over it).
    pub fn record<C: Serialize>(&mut self, key: &TuningKey, tuned: &Tuned<C>) -> std::io::Result<()> {
        let value = serde_json::to_value(tuned).map_err(std::io::Error::other)?;
        self.entries.insert(key.text(), value);
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension(format!("json.{}", std::process::id()));
        let text = serde_json::to_string_pretty(&self.entries).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.path)
    }
}

/// Where a measured crossover ends: the largest of the distinct `sizes` up to which `wins` held
/// at every size measured (0 when it did not at the smallest). Sizes are sorted here.
pub fn crossover(sizes: impl IntoIterator<Item = usize>, wins: impl Fn(usize) -> bool) -> usize {
    let mut sizes: Vec<usize> = sizes.into_iter().collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes.into_iter().take_while(|s| wins(*s)).last().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::{Gemm, GemmConfig};

    #[test]
    fn choices_round_trip_through_the_file_and_bad_entries_are_ignored() {
        let dir = std::env::temp_dir().join(format!("trident-tuning-{}", std::process::id()));
        let path = dir.join("tuning.json");
        let _ = std::fs::remove_dir_all(&dir);
        let g = Gemm {
            block_m: 64,
            block_n: 128,
            block_k: 128,
            stages: 4,
            warp_specialize: true,
            ..Gemm::new(DType::BF16)
        };
        let key = |dtype, shape: &[usize]| TuningKey {
            op: "gemm",
            device: "NVIDIA H200".into(),
            world: 1,
            dtype,
            shape: shape.to_vec(),
        };
        let k = key(DType::BF16, &[128, 8192, 8192]);
        let mut c = TuningCache::load(path.clone());
        assert!(c.get::<GemmConfig>(&k).is_none());
        c.record(&k, &Tuned { config: GemmConfig::of(&g), ms: 0.058 }).unwrap();
        let back = TuningCache::load(path.clone());
        let got = back.get::<GemmConfig>(&k).expect("recorded");
        assert_eq!(got.config.apply(Gemm::new(DType::BF16)), g);
        assert_eq!(got.ms, 0.058);
        assert!(back.get::<GemmConfig>(&key(DType::F16, &[128, 8192, 8192])).is_none());
        // Another operation's configuration under the key: ignored, not an error.
        assert!(back.get::<Vec<String>>(&k).is_none());
        std::fs::write(&path, "not json").unwrap();
        assert!(TuningCache::load(path).entries.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
