"""Kernels on torch CUDA tensors on the nvidia backend, without copies (skipped without torch,
CUDA or a GPU: CI has none)."""

import math
import pathlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for torch", allow_module_level=True)

import trident  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_gelu_on_cuda_tensors_in_place():
    k = trident.compile(ROOT / "examples" / "gelu.tile", backend="nvidia")
    n = 100_000
    x = torch.empty(n, device="cuda", dtype=torch.float32).uniform_(-4, 4)
    out = torch.full((n,), float("nan"), device="cuda", dtype=torch.float32)
    ptr = out.data_ptr()
    k[(n + 255) // 256](x, out, n)
    assert out.data_ptr() == ptr  # written in place: no copy
    want = x.double() * (1 + torch.erf(x.double() / math.sqrt(2))) / 2
    assert torch.max(torch.abs(out.double() - want)).item() <= 1e-5


def test_a_cuda_tensor_of_the_wrong_dtype():
    k = trident.compile(ROOT / "examples" / "gelu.tile", backend="nvidia")
    x = torch.zeros(10, device="cuda", dtype=torch.float16)
    with pytest.raises(trident.ArgumentError, match="torch.float16"):
        k[1](x, x, 10)
