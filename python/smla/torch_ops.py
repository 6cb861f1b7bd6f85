"""smla's calls as PyTorch custom operators (torch.library), registered on import:

    import smla.torch_ops
    torch.ops.smla.sparse_mla_decode(query=..., ..., out=out)
    torch.ops.smla.quantize_kv(rows=..., slots=..., pool=pool)

Under torch.compile each call stays one opaque node that mutates the arguments its schema marks
(`Tensor(a!)`), with no graph break and no tracing into the package; eagerly and under CUDA-graph
capture it is the plain call, on the current stream. Arguments are named as in
smla.sparse_mla_decode and smla.quantize_kv (pass them by name: torch.library wants tensors
positional, scalars may be keyword-only). The outputs `lse`, `workspace` and `kv_counters` have
no default (pass None for none): a mutated argument left to its default breaks torch 2.11's
dispatch. TopkColumns' fields are flattened into `topk_indices`, `topk_block_table`,
`compress_ratio`, `num_decodes` and `is_valid_token`, and its errors name them so."""

from typing import Optional

import torch

from ._errors import raise_renamed
from .decode import WINDOW, TopkColumns
from .decode import sparse_mla_decode as _traced_decode
from .quantize import quantize_kv as _traced_quantize_kv

# The plain calls: the public ones become these operators when traced (smla._traced).
_decode = _traced_decode.__wrapped__
_quantize_kv = _traced_quantize_kv.__wrapped__

Tensor = torch.Tensor


@torch.library.custom_op("smla::sparse_mla_decode",
                         mutates_args=("out", "lse", "workspace", "kv_counters"))
def sparse_mla_decode(query: Tensor, swa_kv_cache: Tensor, sparse_indices: Tensor,
                      sparse_topk_lens: Optional[Tensor], seq_lens: Tensor, out: Tensor,
                      lse: Optional[Tensor], workspace: Optional[Tensor],
                      kv_counters: Optional[Tensor], compressed_kv_cache: Optional[Tensor] = None,
                      cum_seq_lens_q: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
                      topk_indices: Optional[Tensor] = None,
                      topk_block_table: Optional[Tensor] = None,
                      is_valid_token: Optional[Tensor] = None, *, bmm1_scale: float,
                      max_q_len: int = 1, bmm2_scale: float = 1.0, window: int = WINDOW,
                      compress_ratio: int = 0, num_decodes: int = 0) -> None:
    """smla.sparse_mla_decode; `topk_indices` given reads the compressed columns as
    TopkColumns(topk_indices, topk_block_table, compress_ratio, num_decodes, is_valid_token)."""
    # Built whatever is given: the call refuses a top-k's other fields without its indices.
    topk = TopkColumns(topk_indices, topk_block_table, compress_ratio, num_decodes, is_valid_token)
    try:
        _decode(query=query, swa_kv_cache=swa_kv_cache, sparse_indices=sparse_indices,
                sparse_topk_lens=sparse_topk_lens, seq_lens=seq_lens, out=out,
                bmm1_scale=bmm1_scale, compressed_kv_cache=compressed_kv_cache,
                cum_seq_lens_q=cum_seq_lens_q, max_q_len=max_q_len, sinks=sinks,
                bmm2_scale=bmm2_scale, lse=lse, workspace=workspace, kv_counters=kv_counters,
                window=window, topk_columns=topk)
    except Exception as e:  # the top-k's fields named as this op's flat arguments
        raise_renamed(e, _FLAT_TOPK_NAMES)


_FLAT_TOPK_NAMES = {f"topk_columns.{field}": name for field, name in (
    ("topk_indices", "topk_indices"), ("block_table", "topk_block_table"),
    ("compress_ratio", "compress_ratio"), ("num_decodes", "num_decodes"),
    ("is_valid_token", "is_valid_token"))}


@sparse_mla_decode.register_fake
def _(*args, **kwargs) -> None:
    return None  # writes its outputs in place; nothing to allocate


@torch.library.custom_op("smla::quantize_kv", mutates_args=("pool",))
def quantize_kv(rows: Tensor, slots: Tensor, pool: Tensor, *, kv_scale: float = 1.0) -> None:
    """smla.quantize_kv."""
    _quantize_kv(rows=rows, slots=slots, pool=pool, kv_scale=kv_scale)


@quantize_kv.register_fake
def _(*args, **kwargs) -> None:
    return None


# Each op's arguments that its schema takes by position, in order: the traced calls pass them so
# (smla._traced), since dynamo refuses a non-contiguous tensor passed to any op as `out=`.
POSITIONAL = {name: tuple(a.name for a in getattr(torch.ops.smla, name).default._schema.arguments
                          if not a.kwarg_only) for name in ("sparse_mla_decode", "quantize_kv")}
