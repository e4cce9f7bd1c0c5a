"""trident.distributed from torch: torchrun starts 2 processes sharing the GPU (a gloo group,
NVSHMEM underneath) running ``torchrun/check_ops.py`` (skipped without torch, CUDA, torchrun
or NVSHMEM: CI has none of them)."""

import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for torch", allow_module_level=True)
if not (os.environ.get("TRIDENT_NVSHMEM_LIB") or os.environ.get("NVSHMEM_HOME")):
    pytest.skip("no NVSHMEM (set TRIDENT_NVSHMEM_LIB)", allow_module_level=True)

HERE = pathlib.Path(__file__).resolve().parent


def test_two_processes_sharing_the_gpu_run_the_ops_graphs_and_blocks():
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(
        [*torchrun, "--standalone", "--nproc-per-node", "2", str(HERE / "torchrun" / "check_ops.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(r.stdout[-20000:])
    print(r.stderr[-8000:], file=sys.stderr)
    assert r.returncode == 0, r.stderr[-4000:]
    for rank in (0, 1):
        assert f"rank {rank}: ALL PASS" in r.stdout
