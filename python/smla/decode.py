"""The decode op (SPEC §2) and the sizes of its buffers (SPEC §3)."""

from dataclasses import dataclass
from typing import Any, Optional

from . import _smla
from ._arrays import (BF16, COUNTERS, F32, I32, POOL, QUERY, U8, device_of, instance, integer,
                      on_device, parse_device, scale, stream_handle, tensor, utf8)
from ._errors import type_error
from ._traced import as_torch_op

WINDOW = _smla.WINDOW


@dataclass
class TopkColumns:
    """Compressed columns [W, W + top_k) read straight from an index source's local top-k, as
    build_sparse_indices would write them (smla::TopkColumns): sparse_indices then needs only
    its SWA columns and sparse_topk_lens is None."""

    topk_indices: Any                # [T, top_k] i32 local entries, -1 padded (valid first)
    block_table: Any                 # [>= B, pages] i32 of compressed_kv_cache
    compress_ratio: int              # >= 1
    num_decodes: int = 0             # requests [0, num_decodes) decode, the rest prefill
    is_valid_token: Any = None       # [T] u8; None: all valid


def _op_arguments(kwargs: dict) -> dict:
    """torch.ops.smla.sparse_mla_decode's arguments for a call's: TopkColumns flattened, the
    outputs it needs named (smla.torch_ops)."""
    arguments = {k: v for k, v in kwargs.items() if k not in ("topk_columns", "stream")}
    topk = kwargs.get("topk_columns")
    if topk is not None:
        arguments.update(topk_indices=topk.topk_indices, topk_block_table=topk.block_table,
                         compress_ratio=topk.compress_ratio, num_decodes=topk.num_decodes,
                         is_valid_token=topk.is_valid_token)
    for output in ("lse", "workspace", "kv_counters"):
        arguments.setdefault(output, None)
    return arguments


@as_torch_op("sparse_mla_decode", _op_arguments, ("bmm1_scale", "bmm2_scale", "max_q_len", "window",
                                                 "compress_ratio", "num_decodes"))
def sparse_mla_decode(*, query, swa_kv_cache, sparse_indices, sparse_topk_lens, seq_lens, out,
                      bmm1_scale, compressed_kv_cache=None, cum_seq_lens_q=None, max_q_len=1,
                      sinks=None, bmm2_scale=1.0, lse=None, workspace=None, kv_counters=None,
                      window=WINDOW, topk_columns: Optional[TopkColumns] = None,
                      stream=None) -> None:
    """Writes the sparse MLA attention of `query` into `out` (and `lse`), as smla::DecodeArgs
    describes (SPEC §2): query [T, H, 512], pools [blocks, block_size, (1,) row],
    sparse_indices [T, K] i32 storage offsets (-1 padding), sparse_topk_lens [T], seq_lens [B],
    cum_seq_lens_q [B+1] (None: one token per request), sinks [H] f32, out [T, H_out, 512] bf16
    (heads >= H get zeros), lse [T, H] f32, workspace u8 and kv_counters (CUDA; see
    kv_counter_buffer / workspace_buffer); topk_columns (TopkColumns) reads the compressed
    columns from a top-k instead of the table.

    Runs on the arrays' device: NumPy arrays on the CPU; CUDA tensors on `stream` (default: the
    framework's current stream), one launch, capturable in a CUDA graph. Bad input raises
    TypeError (dtype, device) or ValueError (shape, value) naming the argument;
    NotImplementedError for valid input this build or device cannot run. Traced by
    torch.compile (torch tensors, float scales, no `stream`), it is
    torch.ops.smla.sparse_mla_decode."""
    topk = (instance(topk_columns, TopkColumns, "topk_columns") if topk_columns is not None
            else TopkColumns(None, None, 0))
    q = tensor(query, "query", required="a [T, H, 512] array", takes=QUERY)
    device = device_of(q)
    args = dict(
        query=q,
        swa_kv_cache=tensor(swa_kv_cache, "swa_kv_cache", takes=POOL),
        compressed_kv_cache=tensor(compressed_kv_cache, "compressed_kv_cache", takes=POOL),
        sparse_indices=tensor(sparse_indices, "sparse_indices", takes=I32),
        sparse_topk_lens=tensor(sparse_topk_lens, "sparse_topk_lens", takes=I32),
        seq_lens=tensor(seq_lens, "seq_lens", takes=I32),
        cum_seq_lens_q=tensor(cum_seq_lens_q, "cum_seq_lens_q", takes=I32),
        max_q_len=integer(max_q_len, "max_q_len"),
        sinks=tensor(sinks, "sinks", takes=F32),
        bmm1_scale=scale(bmm1_scale, "bmm1_scale"),
        bmm2_scale=scale(bmm2_scale, "bmm2_scale"),
        out=tensor(out, "out", writable=True, takes=BF16),
        lse=tensor(lse, "lse", writable=True, takes=F32),
        workspace=tensor(workspace, "workspace", writable=True, takes=U8),
        kv_counters=tensor(kv_counters, "kv_counters", writable=True, takes=COUNTERS),
        window=integer(window, "window"),
        topk_indices=tensor(topk.topk_indices, "topk_columns.topk_indices", takes=I32),
        topk_block_table=tensor(topk.block_table, "topk_columns.block_table", takes=I32),
        is_valid_token=tensor(topk.is_valid_token, "topk_columns.is_valid_token",
                              takes=U8),
        num_decodes=integer(topk.num_decodes, "topk_columns.num_decodes", 64),
        compress_ratio=integer(topk.compress_ratio, "topk_columns.compress_ratio"),
        stream=stream_handle(stream, device, query),
    )
    with on_device(device, query):
        _smla.sparse_mla_decode(**args)


def kv_counter_bytes(max_tokens: int, num_heads: int) -> int:
    """Bytes of multi-CTA counters for launches of up to `max_tokens` tokens of `num_heads`
    heads (0 in a build without CUDA)."""
    return _smla.kv_counter_bytes(integer(max_tokens, "max_tokens", 64),
                                  integer(num_heads, "num_heads"))


def workspace_bytes(max_tokens: int, num_heads: int, max_columns: int, device="cuda") -> int:
    """Bytes of split-KV workspace enough for every launch of `num_heads` heads with at most
    `max_tokens` tokens and `max_columns` columns on `device` (0 on the CPU)."""
    kind, index = parse_device(device)
    return _smla.workspace_bytes(integer(max_tokens, "max_tokens", 64),
                                 integer(num_heads, "num_heads"),
                                 integer(max_columns, "max_columns", 64), kind, index)


def query_capability(head_size: int, query_dtype: str, kv_dtype: str, block_size: int,
                     device="cpu") -> tuple:
    """(supported, reason) for one configuration on one device; dtypes by smla's names
    ("bf16", "f8e4m3", "u8" for fp8_ds_mla)."""
    kind, index = parse_device(device)
    for name, dtype in (("query_dtype", query_dtype), ("kv_dtype", kv_dtype)):
        if not isinstance(dtype, str):
            raise type_error(name, "a dtype name (bf16, f8e4m3, u8)", type(dtype).__name__)
    return _smla.query_capability(integer(head_size, "head_size"), utf8(query_dtype),
                                  utf8(kv_dtype), integer(block_size, "block_size"), kind, index)


def max_topk_width(device="cpu") -> int:
    """The widest top-k (TopkColumns.topk_indices' columns) the decode reads on `device`: 2048
    on CUDA, 2**63 - 1 on the CPU (no limit of its own; W + top_k <= 2**31 - 32 holds on every
    device), 0 where this build cannot run. A StepExecutor reads wider ones from built tables."""
    kind, index = parse_device(device)
    return _smla.max_topk_width(kind, index)


def backend_info() -> str:
    """The devices this build can run on and what each supports (as `smla info` prints)."""
    return _smla.backend_info()
