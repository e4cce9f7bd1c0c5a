"""Kernels from text and from files on the CPU backends, against float64 references on fresh
random inputs, outputs poisoned before each launch; and every error path."""

import math
import pathlib

import numpy as np
import pytest

import trident

ROOT = pathlib.Path(__file__).resolve().parents[2]
BACKENDS = ["cpu", "cpu-simt"]

SCALE = """
kernel @scale(%x: !ptr<f32>, %out: !ptr<f32>, %a: f32, %n: i32) attributes {warps = 4, stages = 2, cooperative = false} {
  %pid = program_id x : i32
  %bs = const 128 : i32
  %base = mul %pid, %bs : i32
  %lanes = arange 0, 128 : tile<128xi32>
  %b = splat %base : tile<128xi32>
  %i = add %b, %lanes : tile<128xi32>
  %nn = splat %n : tile<128xi32>
  %m = cmp lt %i, %nn : tile<128xi1>
  %xs = splat %x : tile<128x!ptr<f32>>
  %xp = addptr %xs, %i : tile<128x!ptr<f32>>
  %v = load %xp, mask %m : tile<128xf32>
  %as = splat %a : tile<128xf32>
  %y = mul %v, %as : tile<128xf32>
  %os = splat %out : tile<128x!ptr<f32>>
  %op = addptr %os, %i : tile<128x!ptr<f32>>
  store %op, %y, mask %m
  return
}
"""


def rng():
    return np.random.default_rng()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kernel_from_text_scales_a_vector(backend):
    k = trident.compile(SCALE, backend=backend)
    assert k.name == "scale" and k.backend == backend
    assert [p[:2] for p in k.params] == [("x", "ptr"), ("out", "ptr"), ("a", "scalar"), ("n", "scalar")]
    n = 1000
    x = rng().uniform(-1, 1, n).astype(np.float32)
    out = np.full(n, np.nan, np.float32)
    a = float(rng().uniform(0.5, 2.0))
    k[(math.ceil(n / 128),)](x, out, a, n)
    want = x.astype(np.float64) * np.float64(np.float32(a))
    assert np.all(np.isfinite(out))
    assert np.max(np.abs(out - want)) <= 1e-6 * np.max(np.abs(want))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kernel_from_a_file_computes_gelu(backend):
    k = trident.compile(ROOT / "examples" / "gelu.tile", backend=backend)
    n = 1000
    x = rng().uniform(-4, 4, n).astype(np.float32)
    out = np.full(n, np.nan, np.float32)
    k[4](x, out, n)
    want = np.array([v * (1 + math.erf(v / math.sqrt(2))) / 2 for v in x.astype(np.float64)])
    assert np.max(np.abs(out - want)) <= 1e-5


def test_masked_lanes_are_left_alone():
    k = trident.compile(SCALE)
    x = np.ones(300, np.float32)
    out = np.full(300, -7.0, np.float32)
    k[3](x, out, 2.0, 200)  # only the first 200 elements
    assert np.all(out[:200] == 2.0) and np.all(out[200:] == -7.0)


def test_the_backends_of_the_build():
    names = [b[0] for b in trident.backends()]
    assert {"cpu", "cpu-simt", "nvidia", "amd"} <= set(names)


# ---- errors: typed, with what and where ----


def test_malformed_text_names_the_line():
    with pytest.raises(trident.ParseError, match=r"<string>.*2"):
        trident.compile("kernel @k() {\n  %x = frobnicate 1 : i32\n}\n")


def test_a_missing_file():
    with pytest.raises(trident.TridentError, match="no_such.tile"):
        trident.compile("no_such.tile")


def test_an_unknown_backend_and_target():
    with pytest.raises(trident.BackendUnavailable, match="rocm"):
        trident.compile(SCALE, backend="rocm")
    with pytest.raises(trident.BackendUnavailable, match="sm_42"):
        trident.compile(SCALE, backend="cpu-simt", target="sm_42")


def test_wrong_arguments():
    k = trident.compile(SCALE)
    x, out = np.zeros(10, np.float32), np.zeros(10, np.float32)
    with pytest.raises(trident.ArgumentError, match="takes 4 arguments"):
        k[1](x, out, 1.0)
    with pytest.raises(trident.ArgumentError, match="float16"):
        k[1](x.astype(np.float16), out, 1.0, 10)
    with pytest.raises(trident.ArgumentError, match="NumPy array"):
        k[1]([0.0] * 10, out, 1.0, 10)
    with pytest.raises(trident.ArgumentError, match="C-contiguous"):
        k[1](np.zeros(20, np.float32)[::2], out, 1.0, 10)
    with pytest.raises(trident.ArgumentError, match="takes an int"):
        k[1](x, out, 1.0, "ten")
    with pytest.raises(trident.ArgumentError, match=r"-2147483648..=2147483647"):
        k[1](x, out, 1.0, 2**40)
    with pytest.raises(trident.ArgumentError, match="grid"):
        k[0](x, out, 1.0, 10)


def test_a_read_only_array_is_honoured():
    k = trident.compile(SCALE)
    x = np.ones(10, np.float32)
    x.flags.writeable = False
    out = np.zeros(10, np.float32)
    k[1](x, out, 3.0, 10)  # reading a read-only array is fine
    assert np.all(out == 3.0)
    ro = np.zeros(10, np.float32)
    ro.flags.writeable = False
    with pytest.raises(trident.ArgumentError, match="read-only array passed as `out`"):
        k[1](x, ro, 3.0, 10)
    assert np.all(ro == 0.0)


def test_a_fault_is_a_kernel_error_naming_the_op():
    k = trident.compile(SCALE)
    x, out = np.zeros(10, np.float32), np.zeros(10, np.float32)
    with pytest.raises(trident.KernelError, match="scale"):
        k[1](x, out, 1.0, 100)  # reads past the 10 elements it was given


# ---- compiling once: in the process, and on disk for the next process ----


def test_the_same_text_is_compiled_once_per_process():
    a, b = trident.compile(SCALE), trident.compile(SCALE)
    assert a._raw is b._raw
    assert trident.compile(SCALE, backend="cpu-simt")._raw is not a._raw


def test_a_new_process_reads_nvidia_kernels_from_the_disk_cache(tmp_path):
    """Compiling for nvidia needs no GPU (the lowering to PTX); a second process reads the
    first one's PTX from the cache instead of lowering again, and gets the same PTX."""
    import subprocess
    import sys

    # A kernel no other test compiles, so that the first process really lowers it.
    text = SCALE.replace("@scale", f"@scale_{tmp_path.name.replace('-', '_')}")
    src = tmp_path / "k.tile"
    src.write_text(text)
    probe = (
        "import sys, trident\n"
        f"k = trident.compile({str(src)!r}, backend='nvidia', target='sm_90a')\n"
        "print(k.from_disk, len(k.text()))\n"
        "print(trident.compile(open(" + repr(str(src)) + ").read(), backend='nvidia', target='sm_90a')._raw.ptx_hash())\n"
    )
    env = dict(__import__("os").environ, TRIDENT_CACHE_DIR=str(tmp_path / "cache"))
    runs = [
        subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout.split()
        for _ in range(2)
    ]
    assert runs[0][0] == "False" and runs[1][0] == "True", runs
    assert runs[0][2] == runs[1][2], "the cached PTX is the PTX"
    assert list((tmp_path / "cache" / "ptx").iterdir())
    env["TRIDENT_PTX_CACHE"] = "0"
    off = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert off.stdout.split()[0] == "False"


def test_an_nvidia_kernel_refuses_numpy_arrays():
    k = trident.compile(SCALE, backend="nvidia", target="sm_90a")
    x = np.zeros(10, np.float32)
    with pytest.raises(trident.ArgumentError, match="CUDA tensor"):
        k[1](x, x, 1.0, 10)
    with pytest.raises(trident.ArgumentError, match="takes 4 arguments"):
        k[1](x, x)
    with pytest.raises(trident.ArgumentError, match="grid"):
        k[0](x, x, 1.0, 10)


QUANT = """
kernel @quant(%x: !ptr<f32>, %q: !ptr<f8e4m3fn>, %n: i32) attributes {warps = 4, stages = 2, cooperative = false} {
  %pid = program_id x : i32
  %bs = const 128 : i32
  %base = mul %pid, %bs : i32
  %lanes = arange 0, 128 : tile<128xi32>
  %b = splat %base : tile<128xi32>
  %i = add %b, %lanes : tile<128xi32>
  %nn = splat %n : tile<128xi32>
  %m = cmp lt %i, %nn : tile<128xi1>
  %xs = splat %x : tile<128x!ptr<f32>>
  %xp = addptr %xs, %i : tile<128x!ptr<f32>>
  %v = load %xp, mask %m : tile<128xf32>
  %c = cast %v : tile<128xf8e4m3fn>
  %qs = splat %q : tile<128x!ptr<f8e4m3fn>>
  %qp = addptr %qs, %i : tile<128x!ptr<f8e4m3fn>>
  store %qp, %c, mask %m
  return
}
"""


def e4m3fn_value(code):
    """The value of an E4M3FN code, from the OCP definition."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 0x7
    if code & 0x7F == 0x7F:
        return math.nan
    return sign * (m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


def e4m3fn_code(x):
    """Round to nearest even, saturating to 448, NaN to 0x7F: the slow way, by search."""
    if math.isnan(x):
        return 0x7F
    sign = 0x80 if math.copysign(1, x) < 0 else 0
    a = min(abs(x), 448.0)
    best = min(range(0x7F), key=lambda c: (abs(e4m3fn_value(c) - a), c & 1))
    return sign | best


@pytest.mark.parametrize("backend", ["cpu"])
def test_fp8_quantization_on_the_cpu(backend):
    k = trident.compile(QUANT, backend=backend)
    assert k.params[1] == ("q", "ptr", "f8e4m3fn")
    edges = [0.0, -0.0, 448.0, 464.0, 465.0, -1e9, 1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10, 7.5 * 2.0**-9, math.nan]
    x = np.concatenate([np.array(edges), rng().uniform(-500, 500, 1000), rng().normal(0, 0.05, 1000)]).astype(np.float32)
    q = np.full(x.size, 0xAA, np.uint8)
    k[(x.size + 127) // 128](x, q, x.size)
    want = np.array([e4m3fn_code(float(v)) for v in x], np.uint8)
    bad = np.nonzero(q != want)[0]
    assert bad.size == 0, [(float(x[i]), hex(q[i]), hex(want[i])) for i in bad[:5]]


PUT_U64 = """
kernel @put(%out: !ptr<u64>, %v: u64) attributes {warps = 1, stages = 2, cooperative = false} {
  %lanes = arange 0, 32 : tile<32xi32>
  %vs = splat %v : tile<32xu64>
  %os = splat %out : tile<32x!ptr<u64>>
  %op = addptr %os, %lanes : tile<32x!ptr<u64>>
  store %op, %vs
  return
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalars_beyond_i64(backend):
    # A launch reads scalars as i64 first and only then as a wider integer: u64 values past
    # i64's range still arrive whole, and what fits no u64 is refused.
    k = trident.compile(PUT_U64, backend=backend)
    for v in [0, 2**63 - 1, 2**63, 2**64 - 1]:
        out = np.full(32, 7, np.uint64)
        k[1](out, v)
        assert (out == np.uint64(v)).all(), (v, out[:4])
    with pytest.raises(trident.ArgumentError, match=r"0..=18446744073709551615"):
        k[1](np.zeros(32, np.uint64), -1)
    with pytest.raises(trident.ArgumentError, match=r"0..=18446744073709551615"):
        k[1](np.zeros(32, np.uint64), 2**64)
