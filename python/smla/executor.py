"""StepExecutor (SPEC §5): every layer's attention of one decode step on tables shared
through SparseIndexTables, with kv counters and workspace allocated once and shared."""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from . import _smla
from ._arrays import (BF16, F32, I32, POOL, QUERY, device_of, instance, integer, items, mapping,
                      on_device, scale, stream_handle, tensor, utf8)
from ._errors import value_error
from .index import StepMetadata, step_metadata


@dataclass
class AttentionLayer:
    """What a layer keeps from step to step (smla::AttentionLayer)."""

    spec: Any                        # LayerSpec
    swa_kv_cache: Any                # its SWA pool; its dtype is the cache dtype
    bmm1_scale: float                # D^-0.5 (times q_scale * kv_scale, fp8_e4m3 cache)
    compressed_kv_cache: Any = None  # compressed layers: the kv source's pool
    sinks: Any = None                # [H] f32
    bmm2_scale: float = 1.0          # kv_scale with an fp8_e4m3 cache (fp8_ds_mla: 1)


@dataclass
class StepInputs:
    """What changes every step (smla::StepInputs)."""

    metadata: StepMetadata
    block_tables: List[Any]                                         # per SWA group
    # By kv source and by index source; None: empty (a step of SWA-only layers).
    compressed_block_tables: Optional[Dict[int, Any]] = field(default_factory=dict)
    topk_indices: Optional[Dict[int, Any]] = field(default_factory=dict)


_QUERY, _OUT = "a [T, H, 512] array", "a [T, H_out, 512] bf16 array"  # a layer's, when None


def _inputs(inputs: StepInputs):
    instance(inputs, StepInputs, "inputs")
    by_layer = {}
    for name, what in (("compressed_block_tables", "{kv source layer: [>= B, pages] array}"),
                       ("topk_indices", "{index source layer: [T, top_k] array}")):
        entries = mapping(getattr(inputs, name), name, what)
        by_layer[name] = {integer(k, f"{name} key"): tensor(t, f"{name}[{k}]", takes=I32)
                          for k, t in entries.items()}
    return _smla.make_step_inputs(
        metadata=step_metadata(inputs.metadata),
        block_tables=[tensor(t, f"block_tables[{g}]", takes=I32)
                      for g, t in enumerate(items(inputs.block_tables, "block_tables"))],
        **by_layer)


class StepExecutor:
    """Runs the layers' attention of each step on the device of their pools, on `stream`
    (default for CUDA: the current stream of the pools' framework, PyTorch or CuPy), fixed
    here: to capture a step in a CUDA graph, make the executor on the stream the capture uses
    (torch.cuda.graph(g, stream=s)) and run one eager step of the same shape first (its
    memory serves the capture); replay on s too, or ordered with it (its blocks are reused in
    s's order).
    Allocates zeroed counters and workspace for steps of up to `max_tokens` tokens and
    `max_columns` table columns. `compressed_index`: "topk" lets the decode read a compressed
    layer's columns from its top-k (the layer shares its group's SWA table); "table" builds each
    compressed key's table as SPEC §5 says; "auto" (default) reads the top-k in every layer of
    a run of one key where some SWA group would hold the table for one layer only, and builds
    tables for a step whose top-k is wider than the decode reads (smla.max_topk_width: 2048 on
    CUDA), where "topk" raises NotImplementedError: here, for a layer whose fixed index_topk is
    wider, else as a step with a wider top-k begins. The output bits are the same."""

    def __init__(self, layers: Sequence[AttentionLayer], max_tokens: int, max_columns: int,
                 stream=None, compressed_index: str = "auto"):
        layers = items(layers, "layers", AttentionLayer)
        for i, l in enumerate(layers):
            instance(l.spec, _smla.LayerSpec, f"layers[{i}].spec")
        if not layers:
            raise value_error("layers", "at least one layer", "none")
        first = tensor(layers[0].swa_kv_cache, "layers[0].swa_kv_cache",
                       required="a KV pool [blocks, block_size, (1,) row]", takes=POOL)
        self._device = device_of(first)
        self._like = layers[0].swa_kv_cache
        handle = stream_handle(stream, self._device, self._like)
        with on_device(self._device, self._like):
            self._executor = _smla.StepExecutor(
                specs=[l.spec for l in layers],
                # The first layer's pool imported once (a bare DLPack capsule reads once only).
                swa_kv_caches=[first] + [tensor(l.swa_kv_cache, f"layers[{i}].swa_kv_cache",
                                                takes=POOL)
                                         for i, l in enumerate(layers) if i > 0],
                compressed_kv_caches=[tensor(l.compressed_kv_cache,
                                             f"layers[{i}].compressed_kv_cache", takes=POOL)
                                      for i, l in enumerate(layers)],
                sinks=[tensor(l.sinks, f"layers[{i}].sinks", takes=F32)
                       for i, l in enumerate(layers)],
                bmm1_scales=[scale(l.bmm1_scale, f"layers[{i}].bmm1_scale")
                             for i, l in enumerate(layers)],
                bmm2_scales=[scale(l.bmm2_scale, f"layers[{i}].bmm2_scale")
                             for i, l in enumerate(layers)],
                kind=self._device[0], id=self._device[1], stream=handle,
                max_tokens=integer(max_tokens, "max_tokens", 64),
                max_columns=integer(max_columns, "max_columns", 64),
                # A str: str() of another kind (None, b"auto") would pass as a name it is not.
                compressed_index=utf8(instance(compressed_index, str, "compressed_index",
                                               '"auto", "topk" or "table"')))

    def begin_step(self, inputs: StepInputs) -> None:
        """Resets the tables; keeps `inputs` (and its arrays) for the step. Every compressed
        layer's entries (its index source's top-k, its kv source's compressed block table) must
        be there; its seq_lens and cum_seq_lens_q, and the top-k and compressed block table of a
        layer whose decode reads its top-k, must have a contiguous last dim (the decodes read
        them so); a refused step keeps the previous one's tables and arrays."""
        with on_device(self._device, self._like):
            self._executor.begin_step(_inputs(inputs))

    def run_layer(self, layer: int, query, out) -> None:
        """`layer`'s attention of query [T, H, 512] into out [T, H_out, 512]; T is the step's
        num_tokens and H the layer's num_heads; out apart from every layer's pools and the
        step's inputs (ValueError naming what it meets). Layers run in model order, each at most
        once a step (skipping is allowed; one at or before the last that ran raises
        ValueError). A call that raises joins the side stream first (a capture of the step can
        still end); the step stays begun and the layer may run again."""
        with on_device(self._device, self._like):
            try:
                self._executor.run_layer(
                    integer(layer, "layer"), tensor(query, "query", required=_QUERY, takes=QUERY),
                    tensor(out, "out", writable=True, required=_OUT, takes=BF16))
            except BaseException:  # KeyboardInterrupt too
                # Refused or interrupted here or while its arrays were taken, before the
                # library's own checks, which join: an earlier layer's lookup may have forked.
                self._executor.join_after_error()
                raise

    def end_step(self) -> None:
        """Joins the side stream, so a graph capture of the step ends joined."""
        with on_device(self._device, self._like):
            self._executor.end_step()

    def run_step(self, inputs: StepInputs, queries: Sequence, outs: Sequence) -> None:
        """begin_step, every layer in order (queries[i], outs[i] for the i-th), end_step;
        joins on an error too."""
        with on_device(self._device, self._like):
            self._executor.run_step(
                _inputs(inputs),
                [tensor(q, f"queries[{i}]", required=_QUERY, takes=QUERY)
                 for i, q in enumerate(items(queries, "queries"))],
                [tensor(o, f"outs[{i}]", writable=True, required=_OUT, takes=BF16)
                 for i, o in enumerate(items(outs, "outs"))])

    @property
    def stats(self) -> dict:
        """The step's table statistics (builds, forks, waits, peak tables, bytes)."""
        return self._executor.stats()
