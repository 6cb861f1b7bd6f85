"""smla: sparse MLA decode attention for DeepSeek-V4 on Hopper, with a CPU reference backend.

Arrays cross by DLPack without copies: NumPy arrays run on the CPU backend, PyTorch (or CuPy)
CUDA tensors on the GPU, on the caller's current stream. See docs/python.md.
"""

from . import _smla
from ._arrays import Typed, with_dtype
from ._smla import (HEAD_DIM, MAX_HEADS, NOPE_DIM, ROPE_DIM, WINDOW, WITH_CUDA, LayerSpec,
                    ModelPreset, TableSharing, model_presets)
from .buffers import kv_counter_buffer, workspace_buffer
from .decode import (TopkColumns, backend_info, kv_counter_bytes, max_topk_width,
                     query_capability, sparse_mla_decode, workspace_bytes)
from .executor import AttentionLayer, StepExecutor, StepInputs
from .model import model_layers, model_preset, sparse_index_key, topk_width
from .quantize import quantize_kv
from .index import (CompressedColumns, SparseIndexArgs, SparseIndexTable, StepMetadata, SwaGroup,
                    build_sparse_indices, dspark_swa_width, sparse_index_columns)
from .tables import SparseIndexTables

__version__ = "0.1.0"

__all__ = [
    "HEAD_DIM", "NOPE_DIM", "ROPE_DIM", "MAX_HEADS", "WINDOW", "WITH_CUDA",
    "Typed", "with_dtype",
    "sparse_mla_decode", "TopkColumns", "kv_counter_bytes", "workspace_bytes", "query_capability",
    "max_topk_width",
    "backend_info", "kv_counter_buffer", "workspace_buffer",
    "StepMetadata", "SwaGroup", "CompressedColumns", "SparseIndexTable", "SparseIndexArgs",
    "build_sparse_indices", "sparse_index_columns", "dspark_swa_width",
    "LayerSpec", "ModelPreset", "model_presets", "model_preset", "model_layers", "topk_width",
    "sparse_index_key", "TableSharing", "SparseIndexTables",
    "AttentionLayer", "StepInputs", "StepExecutor",
    "quantize_kv",
]
