"""trident from Python: distributed tile kernels for NVIDIA and AMD GPUs.

    import numpy as np, trident
    k = trident.compile("examples/gelu.tile")            # .tile text or a path; backend="cpu"
    x = np.random.rand(1000).astype(np.float32); out = np.zeros_like(x)
    k[(4,)](x, out, 1000)                                 # grid, then one argument per parameter

Arrays are NumPy arrays (C-contiguous; bf16 as ``uint16`` views) on the CPU backends, whose
memory is the interpreter's own: they are copied in before the launch and what the kernel
changed is copied back (a read-only array the kernel writes into raises ``ArgumentError``).
On ``nvidia``, a CUDA tensor (anything with ``data_ptr()`` and ``dtype``) is passed by its
address, without a copy. ``trident.distributed`` runs the library's collectives on a world of
ranks.
"""

import os

import numpy as np

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
    for name, d in _NUMPY.items():
        if d == dtype:
            return name
    return None


def numpy_dtype(element_type):
    """The NumPy dtype an array for `element_type` has (bf16: uint16 bits)."""
    if element_type == "bf16":
        return np.dtype(np.uint16)
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


class Kernel:
    """A compiled kernel: ``kernel[grid](*args)`` launches it and waits for it."""

    def __init__(self, raw):
        self._raw = raw
        self.params = raw.params

    name = property(lambda self: self._raw.name)
    backend = property(lambda self: self._raw.backend)
    target = property(lambda self: self._raw.target)

    def text(self):
        """The kernel's tile IR as text."""
        return self._raw.text()

    def __repr__(self):
        return repr(self._raw)

    def __getitem__(self, grid):
        grid = _grid(grid)
        return lambda *args: self._launch(grid, args)

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
        if any(c[0] == "device" for c in converted if isinstance(c, tuple)):
            # The kernel runs on trident's stream of the device (torch's primary context): the
            # work torch enqueued on its current stream is finished first. (Launching on the
            # caller's stream instead is the next step of the package.)
            import torch

            torch.cuda.current_stream().synchronize()
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
        if self.backend in ("cpu", "cpu-simt"):
            if getattr(getattr(t, "device", None), "type", "cpu") != "cpu":
                raise ArgumentError(
                    f"kernel @{self.name}: `{name}` is on {t.device}; the {self.backend} backend runs on the host"
                )
            return self._pointer(name, etype, t.numpy())[0]
        torch_names = {
            "torch.float32": "f32",
            "torch.float16": "f16",
            "torch.bfloat16": "bf16",
            "torch.float64": "f64",
            "torch.int32": "i32",
            "torch.int64": "i64",
            "torch.int16": "i16",
            "torch.int8": "i8",
            "torch.uint8": "u8",
            "torch.bool": "i1",
        }
        given = torch_names.get(str(t.dtype), str(t.dtype))
        if given != etype:
            raise ArgumentError(f"kernel @{self.name}: `{name}: !ptr<{etype}>` was given a tensor of {t.dtype}")
        if not t.is_contiguous():
            raise ArgumentError(f"kernel @{self.name}: `{name}` is not contiguous (.contiguous() makes a copy that is)")
        return ("device", int(t.data_ptr()), etype)


from . import distributed  # noqa: E402  (after the names it uses)
