//! What GPUs this machine has, without any vendor runtime: PCI display and processing
//! accelerators from sysfs (vendor 0x10de NVIDIA, 0x1002 AMD), and for AMD the KFD topology's
//! `gfx_target_version` (ROCm's kernel driver publishes it even where no ROCm user space is
//! installed). So a skip can say "a gfx942 device is present, but no HIP runtime was found"
//! rather than "no AMD GPU". (Vulkan through `ash` cannot see Instinct GPUs, which have no
//! Vulkan driver; `docs/DECISIONS.md`.)

use std::path::Path;

/// A GPU seen on the PCI bus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciGpu {
    pub address: String,
    pub vendor: u16,
    pub device: u16,
}

/// GPUs on the PCI bus (class 0x03 display or 0x12 processing accelerator) from `root`
/// (normally `/sys/bus/pci/devices`); empty where sysfs is absent.
pub fn pci_gpus_in(root: &Path) -> Vec<PciGpu> {
    let hex = |p: &Path| -> Option<u32> {
        let s = std::fs::read_to_string(p).ok()?;
        u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
    };
    let Ok(entries) = std::fs::read_dir(root) else { return Vec::new() };
    let mut out: Vec<PciGpu> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let d = e.path();
            let class = hex(&d.join("class"))? >> 16;
            let vendor = hex(&d.join("vendor"))? as u16;
            let device = hex(&d.join("device"))? as u16;
            ((class == 0x03 || class == 0x12) && (vendor == 0x10de || vendor == 0x1002)).then(|| PciGpu {
                address: e.file_name().to_string_lossy().into_owned(),
                vendor,
                device,
            })
        })
        .collect();
    out.sort_by(|a, b| a.address.cmp(&b.address));
    out
}

pub fn pci_gpus() -> Vec<PciGpu> {
    pci_gpus_in(Path::new("/sys/bus/pci/devices"))
}

/// AMD GPU targets in the KFD topology under `root` (normally
/// `/sys/class/kfd/kfd/topology/nodes`): `gfx_target_version` 90402 is gfx942, 90010 gfx90a.
pub fn amd_targets_in(root: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(root) else { return Vec::new() };
    let mut out: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let props = std::fs::read_to_string(e.path().join("properties")).ok()?;
            let v: u32 = props.lines().find_map(|l| l.strip_prefix("gfx_target_version "))?.trim().parse().ok()?;
            (v != 0).then(|| format!("gfx{}{}{:x}", v / 10000, (v / 100) % 100, v % 100))
        })
        .collect();
    out.sort();
    out
}

pub fn amd_targets() -> Vec<String> {
    amd_targets_in(Path::new("/sys/class/kfd/kfd/topology/nodes"))
}

/// One line on what is present: "2 NVIDIA GPUs on PCI; no AMD GPU", "AMD: gfx942 x 8 (KFD)".
pub fn summary() -> String {
    let gpus = pci_gpus();
    let (nv, amd) =
        (gpus.iter().filter(|g| g.vendor == 0x10de).count(), gpus.iter().filter(|g| g.vendor == 0x1002).count());
    let targets = amd_targets();
    let amd_text = match (amd, targets.is_empty()) {
        (0, true) => "no AMD GPU".to_string(),
        (_, false) => format!("AMD GPUs {} (KFD topology)", targets.join(", ")),
        (n, true) => format!("{n} AMD GPU(s) on PCI, no KFD topology (amdgpu kernel driver not loaded?)"),
    };
    let nv_text = if nv == 0 { "no NVIDIA GPU".to_string() } else { format!("{nv} NVIDIA GPU(s) on PCI") };
    format!("{nv_text}; {amd_text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pci_and_kfd_trees() {
        let root = std::env::temp_dir().join(format!("trident-discovery-{}", std::process::id()));
        let dev = |name: &str, class: &str, vendor: &str| {
            let d = root.join("pci").join(name);
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in [("class", class), ("vendor", vendor), ("device", "0x74a1")] {
                std::fs::write(d.join(f), format!("{v}\n")).unwrap();
            }
        };
        dev("0000:01:00.0", "0x120000", "0x1002");
        dev("0000:02:00.0", "0x030200", "0x10de");
        dev("0000:03:00.0", "0x020000", "0x8086");
        let gpus = pci_gpus_in(&root.join("pci"));
        assert_eq!(gpus.iter().map(|g| g.vendor).collect::<Vec<_>>(), [0x1002, 0x10de]);
        for (node, v) in [("0", "0"), ("1", "90402"), ("2", "90010")] {
            let d = root.join("kfd").join(node);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("properties"), format!("cpu_cores_count 0\ngfx_target_version {v}\n")).unwrap();
        }
        assert_eq!(amd_targets_in(&root.join("kfd")), ["gfx90a", "gfx942"]);
        assert!(pci_gpus_in(&root.join("absent")).is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }
}
