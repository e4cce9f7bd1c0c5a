//! The communication protocol as the GPUs run it (`simt::protocol::expand`: bounded waits with
//! the diagnostics record and the abort flag, `symm_at` through the heap-base table), executed
//! by cpu-simt's single-device launches for a warp-32 and a wave-64 target.

use std::time::{Duration, Instant};
use trident_backend_cpu::simt_exec::SimtBackend;
use trident_core::backend::{Backend, LaunchOptions};
use trident_core::ir::*;
use trident_core::simt::{lower, protocol, Inst};
use trident_core::KernelBuilder;

const TARGETS: [&str; 2] = ["sm_90a", "gfx942"];

fn link() {
    trident_backend_nvidia::link();
    trident_backend_amd::link();
}

fn i32s(raw: &[u8]) -> Vec<i32> {
    raw.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Each of 6 programs waits until 3 signals (`sig[pid .. pid + 3]`) are `>= 7`, then writes
/// `rank * 100 + pid` through `symm_at(out, rank)`. Unset signals end the launch within the
/// bound with the record's diagnostic, and no program that waited writes anything.
#[test]
fn bounded_waits_and_symm_at_run_as_the_gpus_run_them() {
    link();
    let b = KernelBuilder::new("planted", LaunchAttrs::default());
    let (sig, out) = (b.arg_ptr("sig", DType::U64), b.arg_ptr("out", DType::I32));
    let pid = b.program_id_x();
    let t = b.wait(sig + pid, 3, CmpOp::Ge, 7u64, Scope::Sys, MemSemantic::Acquire);
    let mine = b.symm_at(out, b.rank());
    b.store(mine.consume_token(t) + pid, b.rank() * 100i32 + pid, None);
    let f = b.finish().unwrap();
    for target in TARGETS {
        let backend = SimtBackend;
        let k = backend.compile(&f, Some(target)).unwrap();
        let dev = backend.open_device(0).unwrap();
        let s = dev.alloc(8 * 8, "flags").unwrap();
        let o = dev.alloc(4 * 6, "out").unwrap();
        let poison = (-1i32).to_le_bytes();
        // Signals 0..7 set except signal 5: programs 3, 4 and 5 (which read it) cannot pass.
        let mut flags = [7u64, 9, 7, 8, 7, 0, 7, 7];
        let write_flags = |flags: &[u64; 8]| {
            let bytes: Vec<u8> = flags.iter().flat_map(|x| x.to_le_bytes()).collect();
            dev.write(&s, 0, &bytes).unwrap();
        };
        write_flags(&flags);
        dev.fill(&o, &poison).unwrap();
        let bound = Duration::from_millis(100);
        let opts = LaunchOptions { wait_bound: bound, ..LaunchOptions::default() };
        let start = Instant::now();
        let e =
            dev.launch(&k, [6, 1, 1], &[s.arg(), o.arg()], &opts).expect_err("a planted wait completed").to_string();
        assert!(start.elapsed() < bound * 20, "{target}: the launch took {:?}", start.elapsed());
        for needle in ["timed out", "rank 0", "`flags`[5]", "expected ge 7", "seen 0"] {
            assert!(e.contains(needle), "{target}: the diagnostic lacks `{needle}`: {e}");
        }
        assert!(["program [3,", "program [4,", "program [5,"].iter().any(|p| e.contains(p)), "{target}: {e}");
        let mut raw = [0u8; 24];
        dev.read(&o, 0, &mut raw).unwrap();
        // Programs 3..5 stopped; 0..2 passed, or stopped at their wait when they ran after the
        // abort (as on a GPU, every wait sees the raised flag).
        let got = i32s(&raw);
        assert_eq!(got[3..], [-1, -1, -1], "{target}");
        for (p, v) in got[..3].iter().enumerate() {
            assert!(*v == p as i32 || *v == -1, "{target}: program {p} wrote {v}");
        }

        // The next launch, with every signal set, passes everywhere.
        flags[5] = 7;
        write_flags(&flags);
        dev.fill(&o, &poison).unwrap();
        dev.launch(&k, [6, 1, 1], &[s.arg(), o.arg()], &opts).unwrap();
        dev.read(&o, 0, &mut raw).unwrap();
        assert_eq!(i32s(&raw), [0, 1, 2, 3, 4, 5], "{target}");
    }
}

/// After expansion no protocol instruction is left, and the wait reads the target's clock.
#[test]
fn expansion_leaves_only_primitives() {
    link();
    let b = KernelBuilder::new("w", LaunchAttrs::default());
    let (sig, out) = (b.arg_ptr("sig", DType::U64), b.arg_ptr("out", DType::I32));
    let t = b.wait(sig, 1, CmpOp::Eq, 1u64, Scope::Sys, MemSemantic::Acquire);
    b.store(b.symm_at(out, 0).consume_token(t), 1, None);
    let f = b.finish().unwrap();
    for target in TARGETS {
        let mut k = lower(&f, trident_core::target::lookup(target).unwrap()).unwrap();
        assert!(protocol::has_protocol(&k.body));
        protocol::expand(&mut k);
        assert!(!protocol::has_protocol(&k.body), "{target}");
        assert_eq!(trident_core::simt::count(&k.body, &|i| matches!(i, Inst::Clock { .. })), 2, "{target}");
        assert_eq!(trident_core::simt::count(&k.body, &|i| matches!(i, Inst::Exit)), 1, "{target}");
        // A wait needs no shared memory where the barrier reduces a predicate (`bar.red.or`);
        // elsewhere one word, its own object.
        let want = if target.starts_with("sm_") { 0 } else { 4 };
        assert_eq!(k.shared_bytes, want, "{target}");
    }
}

/// A wait on more signals than the program has threads (300 for 128 or 256 threads) waits for
/// every one of them: with one late signal past the threads' first pass the launch ends with
/// its diagnostic naming it; with all set it passes. (The expansion once covered only the first
/// `threads` signals, so a combine waiting for 256 experts' signals read rows not yet there.)
#[test]
fn a_wait_on_more_signals_than_threads_waits_for_all_of_them() {
    link();
    let b = KernelBuilder::new("many_signals", LaunchAttrs::default());
    let (sig, out) = (b.arg_ptr("sig", DType::U64), b.arg_ptr("out", DType::I32));
    let t = b.wait(sig, 300, CmpOp::Ge, 1u64, Scope::Sys, MemSemantic::Acquire);
    b.store(out.consume_token(t), 1i32, None);
    let f = b.finish().unwrap();
    for target in TARGETS {
        let backend = SimtBackend;
        let k = backend.compile(&f, Some(target)).unwrap();
        let dev = backend.open_device(0).unwrap();
        let s = dev.alloc(8 * 300, "sig").unwrap();
        let o = dev.alloc(4, "out").unwrap();
        let mut flags = vec![1u64; 300];
        flags[290] = 0;
        let bytes = |f: &[u64]| f.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        dev.write(&s, 0, &bytes(&flags)).unwrap();
        dev.fill(&o, &0i32.to_le_bytes()).unwrap();
        let opts = LaunchOptions { wait_bound: Duration::from_millis(50), ..LaunchOptions::default() };
        let e = dev.launch(&k, [1, 1, 1], &[s.arg(), o.arg()], &opts).expect_err("a wait passed signal 290 unset");
        assert!(e.to_string().contains("`sig`[290]"), "{target}: {e}");
        flags[290] = 1;
        dev.write(&s, 0, &bytes(&flags)).unwrap();
        dev.launch(&k, [1, 1, 1], &[s.arg(), o.arg()], &opts).unwrap();
        let mut raw = [0u8; 4];
        dev.read(&o, 0, &mut raw).unwrap();
        assert_eq!(i32s(&raw), [1], "{target}");
    }
}

/// `load_flagged` as the GPUs run it: each of 2 programs polls 64 words of which the first 50
/// are unmasked, until each one's high 32 bits are the flag 5. With one word's flag stale (4)
/// the launch ends within the bound with the diagnostic naming that word and both flags; with
/// every flag current it returns the words themselves, and 0 for the masked-off elements.
#[test]
fn flagged_words_are_polled_until_their_flag_matches() {
    link();
    let b = KernelBuilder::new("flagged", LaunchAttrs::default());
    let (words, out) = (b.arg_ptr("words", DType::U64), b.arg_ptr("out", DType::U64));
    let offs = b.program_id_x() * 64i32 + b.arange(0, 64);
    let mask = b.arange(0, 64).lt(50i32);
    let got = b.load_flagged(words + offs, 5u32, Some(mask));
    b.store(out + offs, got, None);
    let f = b.finish().unwrap();
    let word = |i: usize, flag: u64| (flag << 32) | ((i as u64 * 2_654_435_761) & 0xffff_ffff);
    for target in TARGETS {
        let backend = SimtBackend;
        let k = backend.compile(&f, Some(target)).unwrap();
        let dev = backend.open_device(0).unwrap();
        let w = dev.alloc(8 * 128, "words").unwrap();
        let o = dev.alloc(8 * 128, "out").unwrap();
        let mut ws: Vec<u64> = (0..128).map(|i| word(i, 5)).collect();
        ws[101] = word(101, 4);
        // Past the mask (element 60 of program 1): never read, so a stale flag there is fine.
        ws[124] = word(124, 4);
        let bytes = |f: &[u64]| f.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        dev.write(&w, 0, &bytes(&ws)).unwrap();
        let opts = LaunchOptions { wait_bound: Duration::from_millis(50), ..LaunchOptions::default() };
        let e = dev.launch(&k, [2, 1, 1], &[w.arg(), o.arg()], &opts).expect_err("a stale flag passed").to_string();
        for needle in ["timed out", "flagged word", "`words`[101]", "expected flag 5", "seen flag 4"] {
            assert!(e.contains(needle), "{target}: the diagnostic lacks `{needle}`: {e}");
        }
        ws[101] = word(101, 5);
        dev.write(&w, 0, &bytes(&ws)).unwrap();
        dev.fill(&o, &[0xab]).unwrap();
        dev.launch(&k, [2, 1, 1], &[w.arg(), o.arg()], &opts).unwrap();
        let mut raw = vec![0u8; 8 * 128];
        dev.read(&o, 0, &mut raw).unwrap();
        let got: Vec<u64> = raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        let want: Vec<u64> = (0..128).map(|i| if i % 64 < 50 { ws[i] } else { 0 }).collect();
        assert_eq!(got, want, "{target}");
    }
}
