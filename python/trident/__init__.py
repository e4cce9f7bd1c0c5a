"""trident from Python: distributed tile kernels for NVIDIA and AMD GPUs.

    import numpy as np, trident
    k = trident.compile("examples/gelu.tile")            # .tile text or a path; backend="cpu"
    x = np.random.rand(1000).astype(np.float32); out = np.zeros_like(x)
    k[(4,)](x, out, 1000)                                 # grid, then one argument per parameter

Arrays are NumPy arrays (C-contiguous; bf16 as ``uint16`` views) on the CPU backends, whose
memory is the interpreter's own: they are copied in before the launch and what the kernel
changed is copied back (a read-only array the kernel writes into raises ``ArgumentError``).
On ``nvidia``, torch CUDA tensors (and anything exporting DLPack) are passed by address,
without a copy, and the launch is enqueued on torch's current stream in torch's primary
context: it returns at once, it is ordered with the torch work around it and a CUDA graph
captures it. FP8 tensors go to ``!ptr<u8>`` parameters as bytes. ``trident.synchronize()``
reports a wait that timed out. ``trident.distributed`` runs the library's collectives on a
world of ranks.
"""

import os
import sys

import numpy as np

# Every hardware queue CUDA allows, asked for before the process's CUDA context exists (torch
# creates it later, at its first CUDA call): a world's streams each need a queue of their own,
# or a stream that waits can block one that signals behind it. A value the user set is kept.
if "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ:
    _torch = sys.modules.get("torch")
    if _torch is None or not _torch.cuda.is_initialized():
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"

from . import _trident
from ._trident import (
    ArgumentError,
    BackendUnavailable,
    KernelError,
    ParseError,
    TridentError,
    __version__,
)

__all__ = [
    "compile",
    "synchronize",
    "backends",
    "Kernel",
    "TridentError",
    "ParseError",
    "ArgumentError",
    "BackendUnavailable",
    "KernelError",
    "distributed",
]

# NumPy dtypes by trident element type; bf16 (no NumPy type) travels as uint16 bits, and an
# ``ml_dtypes.bfloat16`` array is taken as such.
_NUMPY = {
    "i1": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "u64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
}


def _element_type(dtype):
    """The trident element type of a NumPy dtype (or None)."""
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return "bf16"
    if dtype.name in ("float8_e4m3fn", "float8_e5m2"):  # ml_dtypes
        return "f8" + dtype.name[len("float8_"):]
    for name, d in _NUMPY.items():
        if d == dtype:
            return name
    return None


def numpy_dtype(element_type):
    """The NumPy dtype an array for `element_type` has (bf16: uint16 bits)."""
    if element_type == "bf16":
        return np.dtype(np.uint16)
    if element_type in ("f8e4m3fn", "f8e5m2"):
        return np.dtype(np.uint8)
    try:
        return _NUMPY[element_type]
    except KeyError:
        raise ArgumentError(f"`{element_type}` is not an element type") from None


def backends():
    """The backends of this build: ``[(name, [targets], description)]``."""
    return _trident.backends()


def compile(source, backend="cpu", target=None):
    """Compiles a kernel from ``.tile`` text or a path to a ``.tile`` file for `backend`
    (``cpu``, ``cpu-simt``, ``nvidia``, ``amd``) and `target` (the backend's default if None).

    Raises ``ParseError`` (with the line) for malformed text or a kernel the verifier rejects,
    ``BackendUnavailable`` for an unknown backend or target, ``KernelError`` if it does not
    compile."""
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and "\n" not in source and source.endswith(".tile")
    ):
        path = os.fspath(source)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise TridentError(f"{path}: {e.strerror}") from None
        return Kernel(_trident.compile(text, backend, target, path))
    if not isinstance(source, str):
        raise TypeError(f"compile takes .tile text or a path, not {type(source).__name__}")
    return Kernel(_trident.compile(source, backend, target, "<string>"))


def _grid(grid):
    if isinstance(grid, int):
        grid = (grid,)
    grid = tuple(grid)
    if not 1 <= len(grid) <= 3 or not all(isinstance(g, int) for g in grid):
        raise ArgumentError(f"grid {grid!r}: one to three ints")
    return grid + (1,) * (3 - len(grid))


class Kernel(_trident.Launchers):
    """A compiled kernel: ``kernel[grid](*args)`` launches it (on the CPU backends, and waits
    for it). ``kernel[grid]`` is looked up by the extension's base class (in ``_launchers``);
    a grid not seen yet comes to ``_launcher``."""

    def __init__(self, raw):
        self._raw = raw
        self.params = raw.params

    name = property(lambda self: self._raw.name)
    backend = property(lambda self: self._raw.backend)
    target = property(lambda self: self._raw.target)
    from_disk = property(lambda self: self._raw.from_disk)

    def text(self):
        """The kernel's tile IR as text."""
        return self._raw.text()

    def __repr__(self):
        return repr(self._raw)

    def _launcher(self, grid):
        key = grid
        grid = _grid(grid)
        if self.backend in ("cpu", "cpu-simt"):
            launcher = lambda *args: self._launch(grid, args)  # noqa: E731
        else:
            # GPU backends: a launcher of the extension, which enqueues on torch's current
            # stream and returns at once.
            launcher = self._raw.at(grid)
        if len(self._launchers) < 1024:
            self._launchers[key] = launcher
        return launcher

    def _launch(self, grid, args):
        if len(args) != len(self.params):
            names = ", ".join(p[0] for p in self.params)
            raise ArgumentError(
                f"kernel @{self.name} takes {len(self.params)} arguments ({names}), got {len(args)}"
            )
        converted, arrays = [], []
        for (name, kind, etype), a in zip(self.params, args):
            if kind == "ptr":
                c, array = self._pointer(name, etype, a)
                converted.append(c)
                arrays.append(array)
            else:
                converted.append(a)
                arrays.append(None)
        changed = self._raw.launch(grid, converted)
        for array, new in zip(arrays, changed):
            if array is not None and new is not None:
                array.reshape(-1).view(np.uint8)[:] = np.frombuffer(new, dtype=np.uint8)

    def _pointer(self, name, etype, a):
        if hasattr(a, "data_ptr") and hasattr(a, "dtype") and not isinstance(a, np.ndarray):
            return self._tensor(name, etype, a), None
        if not isinstance(a, np.ndarray):
            raise ArgumentError(
                f"kernel @{self.name}: `{name}: !ptr<{etype}>` takes a NumPy array "
                f"(or a CUDA tensor on nvidia), not {type(a).__name__}"
            )
        if self.backend not in ("cpu", "cpu-simt"):
            raise ArgumentError(
                f"kernel @{self.name}: `{name}`: NumPy arrays live on the host; the {self.backend} "
                "backend takes device tensors (torch CUDA tensors)"
            )
        given = _element_type(a.dtype)
        if etype == "bf16" and given == "u16":
            given = "bf16"
        if etype.startswith("f8") and given == "u8":
            given = etype  # FP8 travels as uint8 bits
        if given != etype:
            raise ArgumentError(
                f"kernel @{self.name}: `{name}: !ptr<{etype}>` was given an array of {a.dtype}"
                + (" (bf16 travels as uint16 bits)" if etype == "bf16" else "")
            )
        if not a.flags.c_contiguous:
            raise ArgumentError(
                f"kernel @{self.name}: `{name}` is not C-contiguous (np.ascontiguousarray makes a copy that is)"
            )
        readonly = not a.flags.writeable
        return ("host", a.reshape(-1).view(np.uint8).tobytes(), etype, readonly), (None if readonly else a)

    def _tensor(self, name, etype, t):
        # The CPU backends: a torch CPU tensor as the NumPy array sharing its memory.
        if getattr(getattr(t, "device", None), "type", "cpu") != "cpu":
            raise ArgumentError(
                f"kernel @{self.name}: `{name}` is on {t.device}; the {self.backend} backend runs on the host"
            )
        if "float8" in str(t.dtype):
            # FP8 as bytes (NumPy has no FP8): for an FP8 parameter, or u8/i8 as bytes.
            import torch

            t = t.view(torch.int8 if etype == "i8" else torch.uint8)
        elif str(t.dtype) == "torch.bfloat16":
            import torch

            t = t.view(torch.uint16) if hasattr(torch, "uint16") else t.view(torch.int16)
            a = t.numpy().view(np.uint16)
            return self._pointer(name, etype, a)[0]
        return self._pointer(name, etype, t.numpy())[0]


def synchronize(device=None):
    """Waits for the work on a CUDA device (torch's ``torch.cuda.synchronize``) and raises
    ``KernelError`` for a wait of a kernel launched from Python that timed out since the last
    call, naming the kernel and the signal. Launches return at once; their bounded waits still
    end on the device, and this is where what they recorded is reported (``TRIDENT_SYNC_LAUNCH=1``
    checks after every launch instead)."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        index = torch.cuda.current_device() if device is None else torch.device("cuda", device).index
        torch.cuda.synchronize(index)
        _trident.check_waits(index, True)
    else:
        _trident.check_waits(0 if device is None else int(device), False)


from . import distributed  # noqa: E402  (after the names it uses)
