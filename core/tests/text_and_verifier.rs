//! The text format and the verifier on hand-written kernels: distributed ops round-trip, and
//! malformed or ill-typed text gives errors that say what and where.

use trident_core::{text, verify};

const DISTRIBUTED: &str = include_str!("data/distributed.tile");

/// A small well-formed kernel that the error cases below edit.
const SCALE: &str = "kernel @scale(%x: !ptr<f32>, %n: i32) attributes {warps = 4, stages = 2, cooperative = false} {
  %0 = program_id x : i32
  %1 = arange 0, 64 : tile<64xi32>
  %2 = splat %0 : tile<64xi32>
  %3 = add %2, %1 : tile<64xi32>
  %4 = splat %n : tile<64xi32>
  %5 = cmp lt %3, %4 : tile<64xi1>
  %6 = splat %x : tile<64x!ptr<f32>>
  %7 = addptr %6, %3 : tile<64x!ptr<f32>>
  %8 = load %7, mask %5 : tile<64xf32>
  %9 = const 2.5 : f32
  %10 = splat %9 : tile<64xf32>
  %11 = mul %8, %10 : tile<64xf32>
  store %7, %11, mask %5
  return
}
";

#[test]
fn distributed_ops_parse_verify_and_round_trip() {
    let f = text::parse(DISTRIBUTED).unwrap();
    verify(&f).unwrap();
    let printed = text::print(&f);
    assert_eq!(text::print(&text::parse(&printed).unwrap()), printed);
    for op in [
        "rank",
        "num_ranks",
        "symm_at",
        "notify",
        "wait",
        "consume_token",
        "put ",
        "get ",
        "put_signal",
        "fence",
        "quiet",
        "signal_wait_until",
        "barrier_all",
    ] {
        assert!(printed.contains(op), "printed IR lacks `{op}`");
    }
    assert!(f.attrs.cooperative);
}

#[test]
fn canonical_text_is_a_fixed_point() {
    let f = text::parse(SCALE).unwrap();
    verify(&f).unwrap();
    assert_eq!(text::print(&f), SCALE);
}

/// The launch attributes printed only when set (`fast_math`, `warp_specialize`, `persistent`,
/// `inter_node`, `pingpong`, `signalled_before`) parse, print and round-trip.
#[test]
fn optional_launch_attributes_round_trip() {
    let src = SCALE.replace(
        "cooperative = false}",
        "cooperative = false, fast_math = true, warp_specialize = true, persistent = true, inter_node = true, \
         pingpong = true, signalled_before = true}",
    );
    let f = text::parse(&src).unwrap();
    let a = f.attrs;
    assert!(a.fast_math && a.warp_specialize && a.persistent && a.inter_node && a.pingpong && a.signalled_before);
    assert_eq!(text::print(&f), src);
    let plain = text::parse(SCALE).unwrap();
    assert!(!plain.attrs.warp_specialize && !plain.attrs.persistent && !plain.attrs.signalled_before);
}

fn verify_error(src: &str) -> trident_core::VerifyError {
    let f = text::parse(src).unwrap_or_else(|e| panic!("should parse: {e}"));
    verify(&f).unwrap_err()
}

#[test]
fn type_mismatch_names_op_operand_and_line() {
    let bad = SCALE.replace("%11 = mul %8, %10 : tile<64xf32>", "%11 = mul %8, %3 : tile<64xf32>");
    let e = verify_error(&bad);
    assert_eq!(e.op, "mul");
    assert_eq!(e.operand.as_deref(), Some("rhs"));
    assert_eq!(e.loc.map(|l| l.line), Some(13));
    let msg = e.to_string();
    assert!(msg.contains("tile<64xi32>") && msg.contains("line 13"), "{msg}");
}

#[test]
fn wrong_result_type_is_reported() {
    let e =
        verify_error(&SCALE.replace("%8 = load %7, mask %5 : tile<64xf32>", "%8 = load %7, mask %5 : tile<64xf16>"));
    assert_eq!(e.op, "load");
    assert!(e.to_string().contains("does not match pointer"), "{e}");
}

#[test]
fn non_power_of_two_tiles_are_rejected() {
    let e = verify_error(&SCALE.replace("%1 = arange 0, 64 : tile<64xi32>", "%1 = arange 0, 48 : tile<48xi32>"));
    assert_eq!(e.op, "arange");
    assert!(e.to_string().contains("power of two"), "{e}");
}

#[test]
fn values_of_a_region_do_not_escape_it() {
    let src = "kernel @k(%n: i32) {
  %0 = const 0 : i32
  %1 = const 1 : i32
  for %2 = %0 to %n step %1 {
    %3 = add %2, %1 : i32
  }
  %4 = add %3, %1 : i32
  return
}";
    let e = text::parse(src).unwrap_err();
    assert_eq!((e.line, e.message.as_str()), (7, "use of undefined value `%3`"));
}

#[test]
fn parse_errors_carry_line_and_column() {
    let e = text::parse("kernel @k() {\n  %0 = frobnicate %1 : i32\n  return\n}").unwrap_err();
    assert_eq!((e.line, e.col), (2, 8));
    assert!(e.message.contains("unknown op `frobnicate`"));
    let e = text::parse("kernel @k(%a: tile<4xf32) {\n return\n}").unwrap_err();
    assert_eq!(e.line, 1);
    assert!(e.message.contains('>'), "{e}");
    let e = text::parse("kernel @k() {\n  %0 = const 1.5 : i32\n  return\n}").unwrap_err();
    assert!(e.message.contains("not an integer literal"), "{e}");
}

#[test]
fn tile_parameters_and_bad_attributes_are_rejected() {
    let e = verify_error("kernel @k(%t: tile<4xf32>) {\n  return\n}");
    assert!(e.to_string().contains("scalars or pointers"), "{e}");
    let e = verify_error("kernel @k() attributes {warps = 3, stages = 1, cooperative = false} {\n  return\n}");
    assert!(e.to_string().contains("warps = 3"), "{e}");
}

#[test]
fn wait_with_release_semantics_is_rejected() {
    let bad = DISTRIBUTED.replace("sem acquire", "sem release");
    let e = verify_error(&bad);
    assert_eq!((e.op.as_str(), e.operand.as_deref()), ("wait", Some("sem")));
}

#[test]
fn dot_shapes_and_precision_are_checked() {
    let src = "kernel @k() {
  %0 = const 0.0 : f16
  %1 = splat %0 : tile<16x32xf16>
  %2 = splat %0 : tile<16x16xf16>
  %3 = const 0.0 : f32
  %4 = splat %3 : tile<16x16xf32>
  %5 = dot %1, %2, %4, precision ieee : tile<16x16xf32>
  return
}";
    let e = verify_error(src);
    assert_eq!((e.op.as_str(), e.operand.as_deref()), ("dot", Some("b")));
    let e =
        verify_error(&src.replace("tile<16x32xf16>", "tile<16x16xf16>").replace("precision ieee", "precision tf32"));
    assert!(e.to_string().contains("f32 inputs only"), "{e}");
}

/// A kernel that quantizes f32 to FP8 and multiplies FP8 tiles with `dot` (f32 accumulator).
const FP8: &str = "kernel @quant(%x: !ptr<f32>, %q: !ptr<f8e4m3fn>, %b: !ptr<f8e5m2>) attributes {warps = 4, stages = 2, cooperative = false} {
  %0 = arange 0, 16 : tile<16xi32>
  %1 = splat %x : tile<16x!ptr<f32>>
  %2 = addptr %1, %0 : tile<16x!ptr<f32>>
  %3 = load %2 : tile<16xf32>
  %4 = cast %3 : tile<16xf8e4m3fn>
  %5 = splat %q : tile<16x!ptr<f8e4m3fn>>
  %6 = addptr %5, %0 : tile<16x!ptr<f8e4m3fn>>
  store %6, %4
  %7 = reshape %4 : tile<4x4xf8e4m3fn>
  %8 = const 0.0 : f32
  %9 = splat %8 : tile<4x4xf32>
  %10 = dot %7, %7, %9, precision ieee : tile<4x4xf32>
  %11 = const 448.0 : f8e4m3fn
  return
}
";

#[test]
fn fp8_types_parse_verify_and_round_trip() {
    let f = text::parse(FP8).unwrap();
    verify(&f).unwrap();
    let printed = text::print(&f);
    assert!(printed.contains("!ptr<f8e4m3fn>") && printed.contains("!ptr<f8e5m2>"), "{printed}");
    assert_eq!(text::print(&text::parse(&printed).unwrap()), printed);
}

#[test]
fn fp8_values_have_no_arithmetic() {
    let add = FP8.replace("  return\n", "  %12 = add %4, %4 : tile<16xf8e4m3fn>\n  return\n");
    let e = verify_error(&add);
    assert_eq!(e.op, "add");
    assert!(e.to_string().contains("FP8 values have no arithmetic"), "{e}");
    let acc = FP8.replace(
        "%8 = const 0.0 : f32\n  %9 = splat %8 : tile<4x4xf32>\n  %10 = dot %7, %7, %9, precision ieee : tile<4x4xf32>",
        "%8 = const 0.0 : f16\n  %9 = splat %8 : tile<4x4xf16>\n  %10 = dot %7, %7, %9, precision ieee : tile<4x4xf16>",
    );
    let e = verify_error(&acc);
    assert!(e.to_string().contains("accumulator is not valid for `f8e4m3fn`"), "{e}");
}
