//! Communication at inter-node scope: the catalogue's communicating kernels, compiled with
//! `LaunchAttrs::inter_node`, call the vendor library's device functions instead of reaching
//! peers by load and store, and the switch survives the text format. (cpu-simt runs them:
//! `trident test --backend cpu-simt --inter-node`, in `cargo xtask ci`.)

use trident_core::ir::{DType, DeviceCall, SignalOp};
use trident_core::simt::{count, lower, Inst};
use trident_core::target::SM_90A;

fn kernel(name: &str, inter_node: bool) -> trident_core::simt::Kernel {
    let (_, f) = trident_kernels::catalogue(DType::F32).into_iter().find(|(n, _)| *n == name).unwrap();
    let mut f = f.unwrap();
    f.attrs.inter_node = inter_node;
    lower(&f, &SM_90A).unwrap()
}

#[test]
fn puts_gets_and_signals_become_device_calls_at_inter_node_scope() {
    for name in ["allgather", "allreduce_oneshot", "ring_shift_put", "ring_shift_get"] {
        assert!(kernel(name, false).device_calls().is_empty(), "{name}: intra-node scope calls nothing");
    }
    // The ring's put with signal is one library call; no transfer through a peer's address.
    let put = kernel("ring_shift_put", true);
    assert_eq!(put.device_calls(), vec![DeviceCall::PutSignalBlock { nbi: false, op: SignalOp::Set }]);
    assert_eq!(count(&put.body, &|i| matches!(i, Inst::SymmAt { .. })), 0);
    let get = kernel("ring_shift_get", true);
    assert!(get.device_calls().contains(&DeviceCall::GetBlock { nbi: false }), "{:?}", get.device_calls());
    assert!(get.device_calls().contains(&DeviceCall::Quiet), "barrier_all completes the library's puts first");
    // A notify: the program's puts complete, then one thread updates the signal.
    let ag = kernel("allgather", true);
    assert_eq!(ag.device_calls(), vec![DeviceCall::Quiet, DeviceCall::SignalOp { op: SignalOp::Add }]);
}

#[test]
fn the_switch_survives_the_text_format() {
    let (_, f) = trident_kernels::catalogue(DType::F32).into_iter().find(|(n, _)| *n == "allgather").unwrap();
    let mut f = f.unwrap();
    f.attrs.inter_node = true;
    let t = trident_core::text::print(&f);
    assert!(t.contains("inter_node = true"), "{t}");
    assert!(trident_core::text::parse(&t).unwrap().attrs.inter_node);
}
