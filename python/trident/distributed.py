"""The library's collectives on a world of ranks, from Python.

``CpuWorld(ranks)`` runs them on the CPU world: every rank a thread under trident's seeded
scheduler (``seed`` picks the interleaving; ``race=True`` turns on the happens-before race
detector). Each call takes one NumPy array per rank and returns one per rank:

    world = trident.distributed.CpuWorld(4)
    outs = world.all_gather([np.full(100, r, np.float32) for r in range(4)])

Worlds on GPUs from ``torch.distributed`` process groups come next (``docs/USER-GUIDE.md``).
"""

import numpy as np

from . import _trident
from . import ArgumentError, _element_type, numpy_dtype


class CpuWorld:
    """A world of `ranks` CPU ranks (1 to 64)."""

    def __init__(self, ranks, seed=0, race=False):
        if not isinstance(ranks, int) or not 1 <= ranks <= 64:
            raise ArgumentError(f"a CPU world has 1..=64 ranks, not {ranks!r}")
        self.ranks, self.seed, self.race = ranks, seed, race

    def _inputs(self, what, inputs):
        inputs = list(inputs)
        if len(inputs) != self.ranks:
            raise ArgumentError(f"{what}: {len(inputs)} inputs for a world of {self.ranks} ranks")
        arrays = [np.ascontiguousarray(a) for a in inputs]
        etype = _element_type(arrays[0].dtype)
        if etype is None:
            raise ArgumentError(f"{what}: arrays of {arrays[0].dtype} are not a trident element type")
        for r, a in enumerate(arrays):
            if a.dtype != arrays[0].dtype or a.shape != arrays[0].shape:
                raise ArgumentError(
                    f"{what}: rank {r}'s input is {a.dtype}{list(a.shape)}, rank 0's {arrays[0].dtype}{list(arrays[0].shape)}"
                )
        return [a.reshape(-1).view(np.uint8).tobytes() for a in arrays], etype, arrays[0].dtype

    @staticmethod
    def _outputs(raw, dtype):
        return [np.frombuffer(b, dtype=dtype).copy() for b in raw]

    def all_gather(self, inputs):
        """Rank r's output: every rank's input (flattened), in rank order."""
        data, etype, dtype = self._inputs("all_gather", inputs)
        return self._outputs(_trident.all_gather(data, etype, self.seed, self.race), dtype)

    def all_reduce(self, inputs, algorithm="one_shot"):
        """Every rank's output: the element-wise sum of the inputs (``one_shot`` or ``two_shot``)."""
        data, etype, dtype = self._inputs("all_reduce", inputs)
        return self._outputs(_trident.all_reduce(data, etype, algorithm, self.seed, self.race), dtype)

    def reduce_scatter(self, inputs, algorithm="ring"):
        """Each input holds `ranks` equal chunks; rank r's output is the sum of every rank's chunk r
        (``ring`` or ``one_shot``)."""
        data, etype, dtype = self._inputs("reduce_scatter", inputs)
        return self._outputs(_trident.reduce_scatter(data, etype, algorithm, self.seed, self.race), dtype)


__all__ = ["CpuWorld", "numpy_dtype"]
