//! DLPack (`dlpack.h`, the structures v0.8 and 1.x share): reading a capsule another library
//! exported (`launch`), and exporting a block of the symmetric heap to torch as a tensor whose
//! death returns the block (`gpu_world`).

use pyo3::prelude::*;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

#[repr(C)]
pub struct DlDevice {
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
pub struct DlDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
pub struct DlTensor {
    pub data: *mut c_void,
    pub device: DlDevice,
    pub ndim: i32,
    pub dtype: DlDataType,
    pub shape: *const i64,
    pub strides: *const i64,
    pub byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

pub const DL_CPU: i32 = 1;
pub const DL_CUDA: i32 = 2;
pub const DL_CUDA_MANAGED: i32 = 13;
const DL_UINT: u8 = 1;

/// What an exported tensor keeps alive: its shape, and where its death is told.
struct Holder {
    shape: [i64; 1],
    id: u64,
    released: Arc<Mutex<Vec<u64>>>,
}

/// The DLPack deleter of an exported tensor: the block's id goes to `released`.
unsafe extern "C" fn release(m: *mut DlManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` and its holder were made by `export_bytes` from boxes, and the consumer
    // calls the deleter once.
    let m = unsafe { Box::from_raw(m) };
    let h = unsafe { Box::from_raw(m.manager_ctx as *mut Holder) };
    h.released.lock().unwrap_or_else(|e| e.into_inner()).push(h.id);
}

/// The capsule's destructor: a capsule never consumed (still named "dltensor") frees its
/// tensor; a consumed one ("used_dltensor") belongs to the consumer.
unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, c"dltensor".as_ptr()) == 1 {
            let m = pyo3::ffi::PyCapsule_GetPointer(capsule, c"dltensor".as_ptr()) as *mut DlManagedTensor;
            release(m);
        }
    }
}

/// A DLPack capsule of a 1-D `u8` tensor of `bytes` at device `address` of CUDA device
/// `device`; when the consumer frees it, `id` goes to `released`.
pub fn export_bytes<'py>(
    py: Python<'py>,
    address: u64,
    bytes: usize,
    device: usize,
    id: u64,
    released: Arc<Mutex<Vec<u64>>>,
) -> PyResult<Bound<'py, PyAny>> {
    let holder = Box::into_raw(Box::new(Holder { shape: [bytes as i64], id, released }));
    // SAFETY: `holder` was just made and lives until the deleter.
    let shape = unsafe { (*holder).shape.as_ptr() };
    let m = Box::into_raw(Box::new(DlManagedTensor {
        dl_tensor: DlTensor {
            data: address as *mut c_void,
            device: DlDevice { device_type: DL_CUDA, device_id: device as i32 },
            ndim: 1,
            dtype: DlDataType { code: DL_UINT, bits: 8, lanes: 1 },
            shape,
            strides: std::ptr::null(),
            byte_offset: 0,
        },
        manager_ctx: holder as *mut c_void,
        deleter: Some(release),
    }));
    // SAFETY: a capsule of a pointer we own, with the destructor above.
    let capsule = unsafe { pyo3::ffi::PyCapsule_New(m as *mut c_void, c"dltensor".as_ptr(), Some(capsule_destructor)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made: the tensor is ours to free.
        unsafe { release(m) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference just returned by PyCapsule_New.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}
