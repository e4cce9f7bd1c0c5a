//! Tensor maps at launch: each map a kernel's TMA copies read (`simt::tma::TensorMap`) is
//! evaluated against the launch's arguments and encoded by the driver
//! (`cuTensorMapEncodeTiled`) into the 128-byte object passed as a kernel parameter. Arguments
//! that break the hardware's rules, and a driver without the entry point, are typed launch
//! errors naming the tensor.

use cudarc::driver::sys;
use trident_core::backend::{Artifact, BackendError, KernelArg};
use trident_core::ir::DType;
use trident_core::simt::tma::{MapValues, TensorMap};

/// The encoded maps of `maps` for a launch of `kernel` with `args`, in parameter order.
pub(crate) fn encode_all(
    kernel: &Artifact,
    maps: &[TensorMap],
    args: &[KernelArg],
) -> Result<Vec<sys::CUtensorMap>, BackendError> {
    if maps.is_empty() {
        return Ok(Vec::new());
    }
    let fail = |m: &TensorMap, message: String| BackendError::Launch {
        kernel: kernel.kernel.clone(),
        message: format!(
            "the tensor map of `{}` (TMA) cannot be made: {message}",
            kernel.params.get(m.ptr as usize).map(|p| p.0.as_str()).unwrap_or("?")
        ),
    };
    // Looked up once per process, not at every launch.
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: the driver library is loaded (a device is open); looking a symbol up calls nothing.
    let present = *PRESENT
        .get_or_init(|| unsafe { sys::culib().get::<unsafe extern "C" fn()>(b"cuTensorMapEncodeTiled\0") }.is_ok());
    if !present {
        return Err(fail(
            &maps[0],
            "the CUDA driver has no cuTensorMapEncodeTiled (a driver for CUDA 12.0 or later is needed)".into(),
        ));
    }
    maps.iter()
        .map(|m| {
            let v = m.evaluate(args).map_err(|e| fail(m, e))?;
            encode(m.dtype, &v).map_err(|e| fail(m, e))
        })
        .collect()
}

/// `cuTensorMapEncodeTiled` of a 2-D tiled map: zeros outside the tensor, L2 promotion of 256
/// bytes, no interleave.
fn encode(dtype: DType, v: &MapValues) -> Result<sys::CUtensorMap, String> {
    use sys::CUtensorMapDataType::*;
    use sys::CUtensorMapSwizzle::*;
    let data_type = match dtype {
        DType::BF16 => CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::F32 => CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        DType::F64 => CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
        DType::I32 => CU_TENSOR_MAP_DATA_TYPE_INT32,
        DType::U8 | DType::I8 | DType::F8E4M3FN | DType::F8E5M2 => CU_TENSOR_MAP_DATA_TYPE_UINT8,
        DType::U16 | DType::I16 => CU_TENSOR_MAP_DATA_TYPE_UINT16,
        other => return Err(format!("no tensor-map element type for {other}")),
    };
    let swizzle = match v.swizzle {
        0 => CU_TENSOR_MAP_SWIZZLE_NONE,
        32 => CU_TENSOR_MAP_SWIZZLE_32B,
        64 => CU_TENSOR_MAP_SWIZZLE_64B,
        128 => CU_TENSOR_MAP_SWIZZLE_128B,
        s => return Err(format!("no {s}-byte swizzle")),
    };
    let dims = [v.cols, v.rows];
    let strides = [v.row_stride_bytes];
    let boxes = [v.box_cols, v.box_rows];
    let element_strides = [1u32, 1];
    // SAFETY: an all-zero map is a valid value of this plain-data type; the encoder writes it.
    let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
    // SAFETY: every array has the rank's length (2, strides 1), `map` is writable and aligned
    // (its type's alignment), and the address is only recorded, not read.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            2,
            v.address as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(map),
        e => Err(format!("cuTensorMapEncodeTiled: {e:?} ({v:?})")),
    }
}
