"""Sparse-index table builders (SPEC §4), mirroring smla/index.h: the same structs as
dataclasses, and build_sparse_indices(args, stream)."""

from dataclasses import dataclass, field
from typing import Any, Optional

from . import _smla
from ._arrays import (I32, POOL, U8, device_of, instance, integer, on_device, stream_handle,
                      tensor)
from .decode import WINDOW


@dataclass
class StepMetadata:
    """The requests of one step, the same for every layer and SWA group."""

    num_tokens: int                # T (may include CUDA-graph padding tokens)
    seq_lens: Any                  # [B] i32: KV length of each request, new tokens included
    cum_seq_lens_q: Any = None     # [B+1] i32; None: one token per request
    is_valid_token: Any = None     # [T] u8; None: all valid; 0 = padding token
    num_decodes: int = 0           # requests [0, num_decodes) decode, the rest prefill
    max_q_len: int = 1
    decode_swa_width: int = 0      # > window: DSpark non-causal window (dspark_swa_width)


@dataclass
class SwaGroup:
    """One SWA KV-cache group: its block table [>= B, pages] i32 and its pool (geometry only)."""

    block_table: Any
    swa_kv_cache: Any


@dataclass
class CompressedColumns:
    """The compressed columns of a layer; ignored when compress_ratio == 0."""

    compress_ratio: int = 0
    topk_indices: Any = None         # [T, top_k] i32 local top-k, -1 padded (valid first)
    block_table: Any = None          # [>= B, pages] i32 of the compressed cache
    compressed_kv_cache: Any = None  # E = its block_size, and its span


@dataclass
class SparseIndexTable:
    """A built table: what a layer passes to sparse_mla_decode."""

    sparse_indices: Any            # [T, K] i32 storage offsets, -1 = padding
    sparse_topk_lens: Any          # [T] i32
    seq_lens: Any = None           # DSpark only: [T] i32, one request per token


@dataclass
class SparseIndexArgs:
    """What build_sparse_indices reads (a step, an SWA group, a layer's compressed columns
    and window) and the table it fills (`out`, caller-allocated; unset for a lookup)."""

    step: StepMetadata
    swa: SwaGroup
    compressed: CompressedColumns = field(default_factory=CompressedColumns)
    window: int = WINDOW
    out: Optional[SparseIndexTable] = None  # written


def sparse_index_columns(window: int, top_k: int, decode_swa_width: int = 0) -> int:
    """K of a table: window + round_up(top_k, 4) (top_k = 0 for SWA-only layers), or the DSpark
    width (decode_swa_width > window: a multiple of 4, with top_k 0, else ValueError)."""
    return _smla.sparse_index_columns(integer(window, "window"), integer(top_k, "top_k", 64),
                                      integer(decode_swa_width, "decode_swa_width"))


def dspark_swa_width(window: int, num_draft_tokens: int) -> int:
    """DSpark's SWA row width for k draft tokens: round_up(window + k, 64)."""
    return _smla.dspark_swa_width(integer(window, "window"),
                                  integer(num_draft_tokens, "num_draft_tokens"))


def step_metadata(s: StepMetadata):
    """The `_smla.StepMetadata` of `s` (views of its arrays, held alive)."""
    return _step_metadata(s)[0]


def _step_metadata(s: StepMetadata):
    """step_metadata(s), and the `_smla.Tensor` of its seq_lens (None where absent): the device
    of a build. Each array is imported once: a bare DLPack capsule can be read once only."""
    instance(s, StepMetadata, "step")
    num_tokens = integer(s.num_tokens, "num_tokens", 64)
    seq_lens = tensor(s.seq_lens, "seq_lens", takes=I32)
    return _smla.make_step_metadata(
        num_tokens=num_tokens,
        seq_lens=seq_lens,
        cum_seq_lens_q=tensor(s.cum_seq_lens_q, "cum_seq_lens_q", takes=I32),
        is_valid_token=tensor(s.is_valid_token, "is_valid_token", takes=U8),
        num_decodes=integer(s.num_decodes, "num_decodes", 64),
        max_q_len=integer(s.max_q_len, "max_q_len"),
        decode_swa_width=integer(s.decode_swa_width, "decode_swa_width")), seq_lens


def index_args(args: SparseIndexArgs):
    """The `_smla.IndexArgs` of `args` (views of its arrays, held alive)."""
    return _index_args(args)[0]


def _index_args(args: SparseIndexArgs):
    """index_args(args), and the `_smla.Tensor` of its step's seq_lens (see _step_metadata)."""
    instance(args, SparseIndexArgs, "args")
    w = instance(args.swa, SwaGroup, "swa")
    c = instance(args.compressed, CompressedColumns, "compressed")
    o = args.out if args.out is None else instance(args.out, SparseIndexTable, "out")
    o = o or SparseIndexTable(None, None)
    step, seq_lens = _step_metadata(args.step)
    return _smla.make_index_args(
        step=step,
        block_table=tensor(w.block_table, "block_table", takes=I32),
        swa_kv_cache=tensor(w.swa_kv_cache, "swa_kv_cache", takes=POOL),
        compress_ratio=integer(c.compress_ratio, "compress_ratio"),
        topk_indices=tensor(c.topk_indices, "topk_indices", takes=I32),
        compressed_block_table=tensor(c.block_table, "compressed.block_table", takes=I32),
        compressed_kv_cache=tensor(c.compressed_kv_cache, "compressed_kv_cache", takes=POOL),
        window=integer(args.window, "window"),
        sparse_indices=tensor(o.sparse_indices, "sparse_indices", writable=True, takes=I32),
        sparse_topk_lens=tensor(o.sparse_topk_lens, "sparse_topk_lens", writable=True,
                                takes=I32),
        out_seq_lens=tensor(o.seq_lens, "out.seq_lens", writable=True, takes=I32)), seq_lens


def build_sparse_indices(args: SparseIndexArgs, stream=None) -> None:
    """Fills `args.out` (caller-allocated, K from sparse_index_columns) on the device of its
    arrays, on `stream` (default: the framework's current stream) for CUDA ones."""
    built, seq_lens = _index_args(args)
    like = args.step.seq_lens
    device = device_of(seq_lens) if seq_lens is not None else ("cpu", 0)
    with on_device(device, like):
        _smla.build_sparse_indices(built, stream_handle(stream, device, like))
