"""SparseIndexTables (SPEC §5), thin over the C++ class: one step's tables shared by equal
keys, with forked builds for the run's other SWA groups."""

from typing import Callable

from . import _smla
from ._arrays import integer, items, on_device, parse_device, stream_handle
from ._errors import type_error
from .index import SparseIndexArgs, SparseIndexTable, index_args


class SparseIndexTables:
    """Tables of the `layers` (LayerSpecs in model order) on `device`, ordered on `stream`
    (default for CUDA: PyTorch's current stream where torch is imported, else CuPy's, else
    the legacy default stream; fixed from here on). On CUDA, lookup returns torch tensors."""

    def __init__(self, layers, device="cpu", stream=None):
        self._device = parse_device(device)
        handle = stream_handle(stream, self._device, None)
        self._tables = _smla.SparseIndexTables(items(layers, "layers", _smla.LayerSpec),
                                               *self._device, handle)

    def lookup(self, layer: int, inputs: Callable[[int], SparseIndexArgs]) -> SparseIndexTable:
        """The table of `layer`; `inputs(layer)` gives any layer's build arguments (outputs
        unset, compress_ratio and window the layer's LayerSpec's, else ValueError naming the
        field). The arrays view the table's memory (no copy) and keep it: the next step's
        tables, after reset(), are built elsewhere while they live. Every layer of the key in
        the SWA group gets views of that one table, so on the CPU they are read-only NumPy
        arrays (a write raises ValueError); on CUDA, torch tensors, which cannot be made
        read-only: a write (in place, or as an out=) changes the other layers' table too, so
        clone before changing one."""
        if not callable(inputs):
            raise type_error("inputs", "a callable: inputs(layer) -> SparseIndexArgs",
                             type(inputs).__name__)

        def build_args(other):
            args = inputs(other)
            if not isinstance(args, SparseIndexArgs):
                raise type_error("inputs", "a callable that returns a SparseIndexArgs",
                                 f"{type(args).__name__} from inputs({other})")
            return index_args(args)

        with on_device(self._device, None):
            indices, lens, seq_lens = self._tables.lookup(integer(layer, "layer"), build_args)
        return SparseIndexTable(indices, lens, seq_lens)

    def join(self) -> None:
        """The current stream waits for every fork since the last join."""
        self._tables.join()

    def reset(self) -> None:
        """Joins, then forgets the step's tables and stats."""
        self._tables.reset()

    @property
    def stats(self) -> dict:
        """The step's table statistics since reset() (builds, forks, waits, peak tables,
        bytes)."""
        return self._tables.stats()

