//! What a code object says about its kernels, read without any AMD tool: the ELF notes, the
//! `NT_AMDGPU_METADATA` note (msgpack), the symbol tables; and the checks every compiled kernel
//! must pass when no AMD GPU can run it (wave size, workgroup size, LDS, private segment and
//! spills, registers, the argument layout the launcher packs, no undefined symbols).

use std::collections::BTreeMap;
use trident_core::simt::{Kernel, SType};

/// A msgpack value.
#[derive(Clone, Debug, PartialEq)]
pub enum Msg {
    Nil,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Bin(Vec<u8>),
    Array(Vec<Msg>),
    Map(Vec<(Msg, Msg)>),
}

impl Msg {
    pub fn get(&self, key: &str) -> Option<&Msg> {
        match self {
            Msg::Map(m) => m.iter().find(|(k, _)| matches!(k, Msg::Str(s) if s == key)).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn int(&self) -> Option<i128> {
        match self {
            Msg::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub fn str(&self) -> Option<&str> {
        match self {
            Msg::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn array(&self) -> &[Msg] {
        match self {
            Msg::Array(a) => a,
            _ => &[],
        }
    }
}

/// Decodes one msgpack value from the front of `b`, returning it and the rest.
pub fn msgpack(b: &[u8]) -> Result<(Msg, &[u8]), String> {
    let (&tag, rest) = b.split_first().ok_or("truncated msgpack")?;
    let take = |rest: &[u8], n: usize| -> Result<(u64, usize), String> {
        let bytes = rest.get(..n).ok_or("truncated msgpack")?;
        Ok((bytes.iter().fold(0u64, |a, &x| a << 8 | x as u64), n))
    };
    let bytes = |rest: &'_ [u8], n: usize| -> Result<(Vec<u8>, usize), String> {
        Ok((rest.get(..n).ok_or("truncated msgpack")?.to_vec(), n))
    };
    fn seq(mut rest: &[u8], n: usize, pairs: bool) -> Result<(Msg, &[u8]), String> {
        let mut items = Vec::new();
        let mut map = Vec::new();
        for _ in 0..n {
            let (k, r) = msgpack(rest)?;
            rest = r;
            if pairs {
                let (v, r) = msgpack(rest)?;
                rest = r;
                map.push((k, v));
            } else {
                items.push(k);
            }
        }
        Ok((if pairs { Msg::Map(map) } else { Msg::Array(items) }, rest))
    }
    fn string(rest: &[u8], hdr: usize, n: usize) -> Result<(Msg, &[u8]), String> {
        let s = rest.get(hdr..hdr + n).ok_or("truncated msgpack")?;
        Ok((Msg::Str(String::from_utf8_lossy(s).into_owned()), &rest[hdr + n..]))
    }
    Ok(match tag {
        0x00..=0x7f => (Msg::Int(tag as i128), rest),
        0x80..=0x8f => return seq(rest, (tag & 0x0f) as usize, true),
        0x90..=0x9f => return seq(rest, (tag & 0x0f) as usize, false),
        0xa0..=0xbf => return string(rest, 0, (tag & 0x1f) as usize),
        0xc0 => (Msg::Nil, rest),
        0xc2 => (Msg::Bool(false), rest),
        0xc3 => (Msg::Bool(true), rest),
        0xc4..=0xc6 => {
            let hdr = 1 << (tag - 0xc4);
            let (n, _) = take(rest, hdr)?;
            let (v, _) = bytes(&rest[hdr..], n as usize)?;
            (Msg::Bin(v), &rest[hdr + n as usize..])
        }
        0xca => (Msg::Float(f32::from_bits(take(rest, 4)?.0 as u32) as f64), &rest[4..]),
        0xcb => (Msg::Float(f64::from_bits(take(rest, 8)?.0)), &rest[8..]),
        0xcc..=0xcf => {
            let n = 1 << (tag - 0xcc);
            (Msg::Int(take(rest, n)?.0 as i128), &rest[n..])
        }
        0xd0..=0xd3 => {
            let n = 1 << (tag - 0xd0);
            let v = take(rest, n)?.0;
            let shift = 64 - 8 * n as u32;
            (Msg::Int(((v << shift) as i64 >> shift) as i128), &rest[n..])
        }
        0xd9..=0xdb => {
            let hdr = 1 << (tag - 0xd9);
            let (n, _) = take(rest, hdr)?;
            return string(rest, hdr, n as usize);
        }
        0xdc | 0xdd => {
            let hdr = if tag == 0xdc { 2 } else { 4 };
            let (n, _) = take(rest, hdr)?;
            return seq(&rest[hdr..], n as usize, false);
        }
        0xde | 0xdf => {
            let hdr = if tag == 0xde { 2 } else { 4 };
            let (n, _) = take(rest, hdr)?;
            return seq(&rest[hdr..], n as usize, true);
        }
        0xe0..=0xff => (Msg::Int(tag as i8 as i128), rest),
        other => return Err(format!("msgpack tag {other:#x} not used by code object metadata")),
    })
}

/// The parts of an ELF64 code object the checks read.
#[derive(Debug, Default)]
pub struct Elf {
    /// `NT_AMDGPU_METADATA` (type 32, owner `AMDGPU`), decoded.
    pub metadata: Option<Msg>,
    /// Names of undefined symbols in `.symtab` / `.dynsym`.
    pub undefined: Vec<String>,
    /// `e_flags`: the target's `EF_AMDGPU_MACH` in the low byte.
    pub flags: u32,
}

fn u16_at(b: &[u8], o: usize) -> Result<u16, String> {
    b.get(o..o + 2).map(|x| u16::from_le_bytes([x[0], x[1]])).ok_or_else(|| format!("ELF truncated at {o}"))
}

fn u32_at(b: &[u8], o: usize) -> Result<u32, String> {
    b.get(o..o + 4).map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]])).ok_or_else(|| format!("ELF truncated at {o}"))
}

fn u64_at(b: &[u8], o: usize) -> Result<u64, String> {
    b.get(o..o + 8)
        .map(|x| u64::from_le_bytes(x.try_into().unwrap_or([0; 8])))
        .ok_or_else(|| format!("ELF truncated at {o}"))
}

/// Reads the notes and symbols of a little-endian ELF64 file.
pub fn read_elf(b: &[u8]) -> Result<Elf, String> {
    if b.get(..4) != Some(b"\x7fELF") || b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return Err("not a little-endian ELF64 file".into());
    }
    let mut elf = Elf { flags: u32_at(b, 48)?, ..Elf::default() };
    let (shoff, shentsize, shnum) = (u64_at(b, 40)? as usize, u16_at(b, 58)? as usize, u16_at(b, 60)? as usize);
    let section = |i: usize| -> Result<(u32, usize, usize, u32), String> {
        let o = shoff + i * shentsize;
        Ok((u32_at(b, o + 4)?, u64_at(b, o + 24)? as usize, u64_at(b, o + 32)? as usize, u32_at(b, o + 40)?))
    };
    for i in 0..shnum {
        let (kind, off, size, link) = section(i)?;
        if !matches!(kind, 2 | 7 | 11) {
            continue;
        }
        let data = b.get(off..off + size).ok_or("ELF section out of the file")?;
        match kind {
            // SHT_NOTE
            7 => {
                let mut p = 0;
                while p + 12 <= data.len() {
                    let (namesz, descsz, ty) =
                        (u32_at(data, p)? as usize, u32_at(data, p + 4)? as usize, u32_at(data, p + 8)?);
                    let name_at = p + 12;
                    let desc_at = name_at + namesz.next_multiple_of(4);
                    let name = data.get(name_at..name_at + namesz).unwrap_or(&[]);
                    let desc = data.get(desc_at..desc_at + descsz).ok_or("ELF note out of its section")?;
                    if ty == 32 && name.starts_with(b"AMDGPU") {
                        elf.metadata = Some(msgpack(desc)?.0);
                    }
                    p = desc_at + descsz.next_multiple_of(4);
                }
            }
            // SHT_SYMTAB, SHT_DYNSYM: entries of 24 bytes; st_shndx 0 is undefined.
            2 | 11 => {
                let (_, str_off, str_size, _) = section(link as usize)?;
                let strtab = b.get(str_off..str_off + str_size).ok_or("ELF string table out of the file")?;
                for e in data.chunks_exact(24).skip(1) {
                    let (name, shndx) = (u32_at(e, 0)? as usize, u16_at(e, 6)?);
                    if shndx == 0 {
                        let end = strtab[name..].iter().position(|&c| c == 0).map_or(strtab.len(), |z| name + z);
                        let s = String::from_utf8_lossy(&strtab[name..end]).into_owned();
                        if !s.is_empty() {
                            elf.undefined.push(s);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(elf)
}

/// The facts about one kernel of a code object that the checks and the HIP launcher use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelMeta {
    pub name: String,
    pub wavefront_size: u32,
    pub max_flat_workgroup_size: u32,
    pub group_segment_fixed_size: u32,
    pub private_segment_fixed_size: u32,
    pub kernarg_segment_size: u32,
    pub sgpr_count: u32,
    pub vgpr_count: u32,
    pub agpr_count: u32,
    pub sgpr_spill_count: u32,
    pub vgpr_spill_count: u32,
    /// The explicit arguments: (offset, size, value kind).
    pub args: Vec<(u32, u32, String)>,
    /// Counts of the values of every field, for the report.
    pub extra: BTreeMap<String, String>,
}

/// The kernel `name` of a code object's metadata.
pub fn kernel_meta(elf: &Elf, name: &str) -> Result<KernelMeta, String> {
    let meta = elf.metadata.as_ref().ok_or("the code object has no NT_AMDGPU_METADATA note")?;
    let kernels = meta.get("amdhsa.kernels").ok_or("no `amdhsa.kernels` in the metadata")?;
    let k = kernels
        .array()
        .iter()
        .find(|k| k.get(".name").and_then(Msg::str) == Some(name))
        .ok_or_else(|| format!("kernel `{name}` is not in the code object's metadata"))?;
    let n = |key: &str| k.get(key).and_then(Msg::int).unwrap_or(0) as u32;
    let args = k
        .get(".args")
        .map(|a| a.array())
        .unwrap_or(&[])
        .iter()
        .map(|a| {
            let f = |key: &str| a.get(key).and_then(Msg::int).unwrap_or(0) as u32;
            (f(".offset"), f(".size"), a.get(".value_kind").and_then(Msg::str).unwrap_or("").to_string())
        })
        .filter(|(_, _, kind)| !kind.starts_with("hidden_"))
        .collect();
    Ok(KernelMeta {
        name: name.to_string(),
        wavefront_size: n(".wavefront_size"),
        max_flat_workgroup_size: n(".max_flat_workgroup_size"),
        group_segment_fixed_size: n(".group_segment_fixed_size"),
        private_segment_fixed_size: n(".private_segment_fixed_size"),
        kernarg_segment_size: n(".kernarg_segment_size"),
        sgpr_count: n(".sgpr_count"),
        vgpr_count: n(".vgpr_count"),
        agpr_count: n(".agpr_count"),
        sgpr_spill_count: n(".sgpr_spill_count"),
        vgpr_spill_count: n(".vgpr_spill_count"),
        args,
        extra: BTreeMap::new(),
    })
}

/// Bytes and alignment of a kernel argument of type `t`, as the writer declares it.
pub fn arg_size(t: SType) -> u32 {
    match t {
        SType::Pred | SType::Int { bits: 8, .. } => 1,
        SType::Int { bits: 16, .. } | SType::F16 | SType::BF16 => 2,
        SType::Int { bits: 64, .. } | SType::F64 | SType::Ptr => 8,
        _ => 4,
    }
}

/// The explicit-argument layout the launcher packs for `k`: each parameter at its natural
/// alignment, in order.
pub fn expected_args(k: &Kernel) -> Vec<(u32, u32)> {
    let mut off = 0u32;
    k.params
        .iter()
        .map(|(_, t)| {
            let s = arg_size(*t);
            off = off.next_multiple_of(s);
            let at = off;
            off += s;
            (at, s)
        })
        .collect()
}

/// The SGPR spills a GEMM's code object may have, each into a lane of a VGPR (an empty
/// private segment): gfx90a's waiting quantizing FP8 gate/up GEMM of the tensor-parallel MoE
/// block has 27, every one in its chunk walk before the main loop.
pub const SGPR_LANE_SPILLS: u32 = 32;

/// Why a GEMM's spills fail the check, if they do. A GEMM may not spill to memory (a private
/// segment, VGPR spills); its SGPR spills are lanes of a VGPR while the private segment is empty
/// (`v_writelane` / `v_readlane`, no memory), and up to [`SGPR_LANE_SPILLS`] of them pass
/// (docs/DECISIONS.md, "SGPR spills into VGPR lanes").
pub fn gemm_spills(meta: &KernelMeta) -> Option<String> {
    let fails =
        meta.private_segment_fixed_size > 0 || meta.vgpr_spill_count > 0 || meta.sgpr_spill_count > SGPR_LANE_SPILLS;
    fails.then(|| {
        format!(
            "a GEMM with a private segment of {} bytes ({} VGPR and {} SGPR spills; only SGPR spills into VGPR \
             lanes pass, at most {SGPR_LANE_SPILLS})",
            meta.private_segment_fixed_size, meta.vgpr_spill_count, meta.sgpr_spill_count
        )
    })
}

/// Every check a compiled kernel must pass without a GPU; the failures, in words.
pub fn check(elf: &Elf, k: &Kernel, lds_limit: u32) -> Result<KernelMeta, Vec<String>> {
    let meta = kernel_meta(elf, &k.name).map_err(|e| vec![e])?;
    let mut bad = Vec::new();
    if !elf.undefined.is_empty() {
        bad.push(format!("undefined symbols: {}", elf.undefined.join(", ")));
    }
    if meta.wavefront_size != k.warp_size {
        bad.push(format!("wave size {} (the lowering assumed {})", meta.wavefront_size, k.warp_size));
    }
    if meta.max_flat_workgroup_size != k.threads() {
        bad.push(format!(
            ".max_flat_workgroup_size {} != the launch's {} threads",
            meta.max_flat_workgroup_size,
            k.threads()
        ));
    }
    if meta.group_segment_fixed_size > lds_limit || meta.group_segment_fixed_size < k.shared_bytes {
        bad.push(format!(
            "LDS {} bytes (the kernel's objects take {}, the limit is {lds_limit})",
            meta.group_segment_fixed_size, k.shared_bytes
        ));
    }
    let gemm = trident_core::simt::count(&k.body, &|i| matches!(i, trident_core::simt::Inst::Matmul { .. })) > 0;
    if gemm {
        bad.extend(gemm_spills(&meta));
    }
    // gfx90a and gfx942 have one file of 512 registers a lane: `.vgpr_count` is its total (the
    // architectural VGPRs rounded up to 4, plus the AGPRs), not the architectural ones alone.
    if meta.vgpr_count > 512 {
        bad.push(format!(
            "{} registers of the unified VGPR file ({} of them AGPRs) > 512",
            meta.vgpr_count, meta.agpr_count
        ));
    }
    let want = expected_args(k);
    let got: Vec<(u32, u32)> = meta.args.iter().map(|(o, s, _)| (*o, *s)).collect();
    if got != want {
        bad.push(format!("arguments (offset, size) {got:?}, the launcher packs {want:?}"));
    }
    if bad.is_empty() {
        Ok(meta)
    } else {
        Err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msgpack_decodes_the_forms_code_objects_use() {
        // {"a": [1, -2, 300], "b": "xy", "c": true, "d": 70000}
        let b = [
            0x84, 0xa1, b'a', 0x93, 0x01, 0xfe, 0xcd, 0x01, 0x2c, 0xa1, b'b', 0xa2, b'x', b'y', 0xa1, b'c', 0xc3, 0xa1,
            b'd', 0xce, 0x00, 0x01, 0x11, 0x70,
        ];
        let (m, rest) = msgpack(&b).unwrap();
        assert!(rest.is_empty());
        assert_eq!(m.get("a").unwrap().array().iter().filter_map(Msg::int).collect::<Vec<_>>(), [1, -2, 300]);
        assert_eq!(m.get("b").and_then(Msg::str), Some("xy"));
        assert_eq!(m.get("c"), Some(&Msg::Bool(true)));
        assert_eq!(m.get("d").and_then(Msg::int), Some(70000));
        assert!(msgpack(&[0x92, 0x01]).is_err(), "truncated input is an error, not a panic");
        assert!(read_elf(b"not an elf").is_err());
    }

    #[test]
    fn a_gemm_spills_only_sgprs_into_lanes() {
        let lanes = KernelMeta { sgpr_spill_count: SGPR_LANE_SPILLS, ..KernelMeta::default() };
        assert_eq!(gemm_spills(&lanes), None);
        for bad in [
            KernelMeta { sgpr_spill_count: SGPR_LANE_SPILLS + 1, ..KernelMeta::default() },
            KernelMeta { vgpr_spill_count: 1, ..KernelMeta::default() },
            KernelMeta { private_segment_fixed_size: 16, sgpr_spill_count: 4, ..KernelMeta::default() },
        ] {
            assert!(gemm_spills(&bad).is_some_and(|m| m.contains("private segment")), "{bad:?}");
        }
    }
}
