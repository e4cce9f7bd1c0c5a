//! The HIP layer against a stub `libamdhip64` built here (`hip_stub.c`, with the machine's C
//! compiler): the order of calls, the argument buffer packed at the code object's `.args`
//! offsets, and every error path as a typed error. Needs LLVM 19 for the code object and a C
//! compiler for the stub; without them the test says so and passes.

use std::process::Command;
use trident_backend_amd::hip::HipDevice;
use trident_backend_amd::AmdBackend;
use trident_core::backend::{Backend, BackendError, Device, KernelArg, LaunchOptions};
use trident_core::ir::*;
use trident_core::KernelBuilder;

fn set(k: &str, v: Option<&str>) {
    match v {
        Some(v) => std::env::set_var(k, v),
        None => std::env::remove_var(k),
    }
}

#[test]
fn hip_calls_argument_packing_and_errors() {
    trident_backend_amd::link();
    if trident_backend_amd::codeobj::tools().is_err() {
        eprintln!("skipped: no LLVM 19 for the code object");
        return;
    }
    let dir = std::env::temp_dir().join(format!("trident-hip-stub-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libamdhip64.so");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hip_stub.c");
    match Command::new("cc").args(["-shared", "-fPIC", "-O1", "-o"]).arg(&lib).arg(src).status() {
        Ok(s) if s.success() => {}
        other => {
            eprintln!("skipped: no C compiler for the stub ({other:?})");
            return;
        }
    }
    let log = dir.join("calls.log");
    set("STUB_HIP_LOG", Some(log.to_str().unwrap()));
    set("STUB_HIP_FAIL", None);

    // Without the library: a typed NoDevice naming what was tried.
    set("TRIDENT_HIP_LIBRARY", Some(dir.join("absent.so").to_str().unwrap()));
    let e = HipDevice::open(0).err().expect("no library");
    assert!(matches!(&e, BackendError::NoDevice { reason, .. } if reason.contains("HIP runtime not found")), "{e}");
    set("TRIDENT_HIP_LIBRARY", Some(lib.to_str().unwrap()));
    set("STUB_HIP_FAIL", Some("hipInit"));
    let e = HipDevice::open(0).err().expect("hipInit fails");
    assert!(e.to_string().contains("hipInit failed with error 2 (stub: fails on demand)"), "{e}");
    set("STUB_HIP_FAIL", None);

    // A kernel with pointer, i32, f32 and i64 parameters.
    let b = KernelBuilder::new("axpy", LaunchAttrs::default());
    let (x, out) = (b.arg_ptr("x", DType::F32), b.arg_ptr("out", DType::F32));
    let (n, a, tag) = (b.arg("n", DType::I32), b.arg("a", DType::F32), b.arg("tag", DType::I64));
    let i = b.program_id_x() * 128 + b.arange(0, 128);
    let _ = tag;
    b.store(out + i, b.load(x + i, Some(i.lt(n)), None) * a, Some(i.lt(n)));
    let f = b.finish().unwrap();
    let art = AmdBackend.compile(&f, Some("gfx942")).unwrap();
    let dev = HipDevice::open(0).unwrap();
    let (xb, ob) = (dev.alloc(4 * 300, "x").unwrap(), dev.alloc(4 * 300, "out").unwrap());
    let data: Vec<u8> = (0..300u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
    dev.write(&xb, 0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    dev.read(&xb, 0, &mut back).unwrap();
    assert_eq!(back, data, "memcpy round trip");
    std::fs::write(&log, "").unwrap();
    let args = [xb.arg(), ob.arg(), KernelArg::i32(300), KernelArg::f32(2.5), KernelArg::i64(-3)];
    dev.launch(&art, [3, 1, 1], &args, &LaunchOptions::default()).unwrap();
    let calls = std::fs::read_to_string(&log).unwrap();
    let names: Vec<&str> = calls.lines().map(|l| l.split(' ').next().unwrap_or("")).collect();
    let order = ["hipModuleLoadData", "hipModuleGetFunction", "hipModuleLaunchKernel", "hipDeviceSynchronize"];
    let pos: Vec<usize> = order.iter().map(|o| names.iter().position(|n| n == o).unwrap_or(usize::MAX)).collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "call order {names:?}");
    assert!(calls.contains("hipModuleGetFunction axpy"), "{calls}");
    let launch = calls.lines().find(|l| l.starts_with("hipModuleLaunchKernel")).unwrap();
    // 4 waves of 64 lanes.
    assert!(launch.contains("grid 3 1 1 block 256 1 1"), "{launch}");
    // The buffer: x @0, out @8, n @16, a @20, tag @24, then the hidden parameters from 32.
    let hex = launch.rsplit(' ').next().unwrap();
    let bytes: Vec<u8> = (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect();
    assert_eq!(&bytes[0..8], &xb.address.to_le_bytes());
    assert_eq!(&bytes[8..16], &ob.address.to_le_bytes());
    assert_eq!(&bytes[16..20], &300i32.to_le_bytes());
    assert_eq!(&bytes[20..24], &2.5f32.to_le_bytes());
    assert_eq!(&bytes[24..32], &(-3i64).to_le_bytes());
    assert_eq!(&bytes[32..36], &0i32.to_le_bytes(), "__rank");
    assert_eq!(&bytes[36..40], &1i32.to_le_bytes(), "__num_ranks");

    // Failures on demand are typed errors naming the call.
    set("STUB_HIP_FAIL", Some("hipMalloc"));
    let e = dev.alloc(64, "big").unwrap_err();
    assert!(
        matches!(&e, BackendError::Buffer { buffer, message } if buffer == "big" && message.contains("hipMalloc failed")),
        "{e}"
    );
    set("STUB_HIP_FAIL", Some("hipModuleLaunchKernel"));
    let e = dev.launch(&art, [3, 1, 1], &args, &LaunchOptions::default()).unwrap_err();
    assert!(
        matches!(&e, BackendError::Launch { kernel, message } if kernel == "axpy" && message.contains("hipModuleLaunchKernel failed")),
        "{e}"
    );
    set("STUB_HIP_FAIL", None);
    // Streams: a signal written and waited for (HIP's wait takes a mask: all bits), events
    // timing work, IPC handles of an allocation opened again.
    let sig = dev.alloc(8, "sig").unwrap();
    dev.write(&sig, 0, &0u64.to_le_bytes()).unwrap();
    let s = dev.stream().unwrap();
    std::fs::write(&log, "").unwrap();
    dev.write_value(&s, &sig, 0, 7).unwrap();
    dev.wait_value(&s, &sig, 0, 7).unwrap();
    dev.synchronize(&s).unwrap();
    let calls = std::fs::read_to_string(&log).unwrap();
    assert!(calls.contains("hipStreamWriteValue64 7 flags 0"), "{calls}");
    assert!(calls.contains("hipStreamWaitValue64 7 flags 0 mask ffffffffffffffff seen 7"), "{calls}");
    let mut raw = [0u8; 8];
    dev.read(&sig, 0, &mut raw).unwrap();
    assert_eq!(u64::from_le_bytes(raw), 7);
    let ms = dev.time_ms(&s, &mut || dev.launch(&art, [3, 1, 1], &args, &LaunchOptions::default())).unwrap();
    assert_eq!(ms, 1.5);
    let h = dev.ipc_handle(&ob).unwrap();
    assert_eq!(dev.open_ipc(h).unwrap(), ob.address);
    set("STUB_HIP_FAIL", Some("hipStreamWaitValue64"));
    let e = dev.wait_value(&s, &sig, 0, 9).unwrap_err();
    assert!(e.to_string().contains("hipStreamWaitValue64 failed with error 2"), "{e}");
    set("STUB_HIP_FAIL", None);
    drop(s);
    // Wrong arguments never reach HIP.
    let e = dev.launch(&art, [3, 1, 1], &args[..4], &LaunchOptions::default()).unwrap_err();
    assert!(matches!(e, BackendError::Argument { .. }), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
