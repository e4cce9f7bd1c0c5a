//! NumPy `.npy` files (format 1.0, one dimension, little-endian) for `trident run`'s buffers.
//!
//! Element types map to NumPy's: `i1` is `|b1`, `i8` `|i1`, `u8` `|u1`, `f16` `<f2`, .. NumPy
//! has no bf16 or FP8: their buffers are written as `<f4` (exactly) and read from `<f4`
//! (rounded as a cast does).

use crate::ops::values::{decode, encode, V};
use trident_core::ir::DType;

/// NumPy's type string for the file form of `d`.
pub fn descr(d: DType) -> &'static str {
    match d {
        DType::I1 => "|b1",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::I16 => "<i2",
        DType::U16 => "<u2",
        DType::I32 => "<i4",
        DType::U32 => "<u4",
        DType::I64 => "<i8",
        DType::U64 => "<u8",
        DType::F16 => "<f2",
        DType::BF16 | DType::F32 | DType::F8E4M3FN | DType::F8E5M2 => "<f4",
        DType::F64 => "<f8",
    }
}

/// The `.npy` bytes of device memory holding elements of `d`.
pub fn write(d: DType, device_bytes: &[u8]) -> Vec<u8> {
    let n = device_bytes.len() / d.size_bytes() as usize;
    let data: Vec<u8> = if d == DType::BF16 {
        device_bytes
            .chunks_exact(2)
            .flat_map(|c| (half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).to_le_bytes())
            .collect()
    } else if d.is_fp8() {
        device_bytes.iter().flat_map(|&b| (decode(b as u64, d).f() as f32).to_le_bytes()).collect()
    } else {
        device_bytes.to_vec()
    };
    let mut header = format!("{{'descr': '{}', 'fortran_order': False, 'shape': ({n},), }}", descr(d));
    // Magic (6) + version (2) + length (2) + header + '\n', padded to a multiple of 64.
    let total = (10 + header.len() + 1).next_multiple_of(64);
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

/// The device bytes (elements of `d`) of a `.npy` file, which must hold a one-dimensional
/// array of `d`'s file type.
pub fn read(d: DType, file: &[u8]) -> Result<Vec<u8>, String> {
    if file.len() < 10 || &file[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (no \\x93NUMPY magic)".into());
    }
    let (hlen, start) = match file[6] {
        1 => (u16::from_le_bytes([file[8], file[9]]) as usize, 10),
        2 | 3 if file.len() >= 12 => (u32::from_le_bytes([file[8], file[9], file[10], file[11]]) as usize, 12),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = std::str::from_utf8(file.get(start..start + hlen).ok_or("truncated header")?)
        .map_err(|_| "header is not text")?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}'"))? + key.len() + 2;
        let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
        Some(rest)
    };
    let descr_val =
        field("descr").and_then(|r| r.strip_prefix('\'')).and_then(|r| r.split('\'').next()).ok_or("no descr")?;
    if field("fortran_order").is_some_and(|r| r.starts_with("True")) {
        return Err("Fortran-ordered arrays are not supported".into());
    }
    let shape = field("shape").and_then(|r| r.strip_prefix('(')).and_then(|r| r.split(')').next()).ok_or("no shape")?;
    let dims: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("bad shape `{shape}`")))
        .collect::<Result<_, _>>()?;
    let n: usize = dims.iter().product();
    let want = descr(d);
    // `<` and `|` and `=` are all little-endian (or byte-sized) here.
    let norm = |s: &str| s.trim_start_matches(['<', '|', '=']).to_string();
    if norm(descr_val) != norm(want) {
        return Err(format!("holds `{descr_val}`, the parameter needs `{want}` ({d})"));
    }
    let widened = d == DType::BF16 || d.is_fp8();
    let size = if widened { 4 } else { d.size_bytes() as usize };
    let data = file.get(start + hlen..start + hlen + n * size).ok_or("fewer elements than the shape says")?;
    Ok(if widened {
        data.chunks_exact(4)
            .flat_map(|c| {
                let f = f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64;
                let bits = encode(V::F(f), d);
                bits.to_le_bytes()[..d.size_bytes() as usize].to_vec()
            })
            .collect()
    } else {
        data.to_vec()
    })
}

/// A short text of the first elements (for the run's summary).
pub fn preview(d: DType, device_bytes: &[u8], count: usize) -> String {
    let size = d.size_bytes() as usize;
    let shown: Vec<String> = device_bytes
        .chunks_exact(size)
        .take(count)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(c);
            match decode(u64::from_le_bytes(b), d) {
                V::F(f) => format!("{f}"),
                V::I(i) => i.to_string(),
            }
        })
        .collect();
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for d in [DType::F32, DType::BF16, DType::I8, DType::U64, DType::I1, DType::F16] {
            let bytes: Vec<u8> = (0..d.size_bytes() as usize * 5)
                .map(|i| if d == DType::I1 { (i % 2) as u8 } else { (i as u8).wrapping_mul(7) })
                .collect();
            let bytes =
                if d == DType::BF16 { vec![0x80, 0x3f, 0x00, 0xc0, 0, 0, 0x49, 0x40, 0x80, 0xff] } else { bytes };
            let file = write(d, &bytes);
            assert_eq!(&file[..6], b"\x93NUMPY");
            assert_eq!(read(d, &file).unwrap(), bytes, "{d}");
        }
        assert!(read(DType::F32, &write(DType::I32, &[0; 8])).unwrap_err().contains("needs"));
    }
}
