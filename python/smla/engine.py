"""The engine-shaped call: the keyword names engines pass to their DeepSeek-V4 sparse MLA
decode kernel, so an engine on Hopper switches by changing one import:

    from smla.engine import trtllm_batch_decode_sparse_mla_dsv4

Differences from the kernel it stands in for (docs/python.md): arguments are keyword-only;
`sparse_indices` must be storage offsets (`sparse_indices_are_storage_offsets=True`, the
default here); scales are Python floats (or host scalars); `multi_ctas_kv_counter_buffer` and
`workspace_buffer` may be any size (a small one only limits splitting).
"""

import contextlib
import sys

from .buffers import kv_counter_buffer, workspace_buffer  # noqa: F401  (engines import these)
from . import _smla
from .decode import WINDOW, sparse_mla_decode
from ._arrays import I32, QUERY, Typed, framework_of, on_a_device, stream_handle, tensor
from ._errors import import_error, raise_renamed, shape_text, value_error
from ._traced import _torch_compiling

HEAD_DIM = _smla.HEAD_DIM

__all__ = ["trtllm_batch_decode_sparse_mla_dsv4", "trtllm_decode_sparse_mla_dsv4",
           "kv_counter_buffer", "workspace_buffer"]


def _array(x):
    """The array itself, inside a `with_dtype` wrapper or not."""
    return x.array if isinstance(x, Typed) else x


def _module(x):
    """The array module of `x`: torch, cupy or numpy."""
    name = framework_of(x)
    if name in ("torch", "cupy"):
        return sys.modules[name]
    import numpy as np
    return np


def _merge_tokens(x, name: str, ndim: int, merged: dict):
    """_merged_view of x, noting in `merged` the shape the op sees and the caller's (for
    raise_renamed: the op's errors say the shape the caller passed)."""
    view = _merged_view(x, name, ndim)
    if getattr(_array(x), "ndim", ndim) == ndim + 1:
        merged[name] = (_array(view).shape, _array(x).shape)
    return view


def _merged_view(x, name: str, ndim: int):
    """[B, q, ...] -> [B*q, ...] as a view (engines pass [T, 1, H, D] for DSpark); a tensor
    that would need a copy is refused (an output copy would lose the writes)."""
    if isinstance(x, Typed):
        return Typed(_merged_view(x.array, name, ndim), x.dtype)
    if x is None or getattr(x, "ndim", ndim) != ndim + 1:
        return x
    shape = (x.shape[0] * x.shape[1],) + tuple(x.shape[2:])
    xp = _module(x)
    if xp.__name__ == "torch":
        try:
            return x.view(shape)
        except RuntimeError:
            pass
    else:  # NumPy or CuPy (strides in bytes): dims 0 and 1 merge where 0 steps over all of 1
        if not hasattr(x, "strides"):  # another DLPack producer: no view to merge dims with
            raise value_error(name, "[T, ...], or [B, q, ...] from PyTorch, CuPy or NumPy",
                              f"a {ndim + 1}-D {type(x).__name__}")
        s0, s1 = x.strides[:2]
        merged = s0 if x.shape[1] == 1 else s1 if x.shape[0] == 1 or s0 == x.shape[1] * s1 else None
        if merged is not None:
            strides = (merged,) + tuple(x.strides[2:])
            if xp.__name__ == "numpy" and isinstance(x, xp.ndarray) and not x.dtype.hasobject:
                # Through a view of raw elements: as_strided rebuilds a dtype from its type
                # string, which an ml_dtypes float8_e5m2 array's ('<f1') does not name.
                raw = x.view(f"V{x.dtype.itemsize}")
                return xp.lib.stride_tricks.as_strided(raw, shape, strides).view(x.dtype)
            return xp.lib.stride_tricks.as_strided(x, shape, strides)
    strides = f"strides {tuple(x.stride())} (elements)" if xp.__name__ == "torch" else \
        f"strides {tuple(x.strides)} (bytes)"
    raise value_error(name, "[B, q, ...] whose first two dims merge into T without a copy",
                      f"shape {tuple(x.shape)}, {strides}")


def _call_stream(like, stream):
    """A context in which PyTorch or CuPy allocates and queues on the call's device and
    `stream`, where one is given: the temporaries below must be ordered with the kernel."""
    array, xp = _array(like), _module(like)
    if xp.__name__ == "cupy":
        context = contextlib.ExitStack()
        context.enter_context(xp.cuda.Device(array.device.id))
        if stream is not None:
            handle = stream_handle(stream, ("cuda", array.device.id))
            context.enter_context(xp.cuda.ExternalStream(handle))
        return context
    if stream is None or xp.__name__ != "torch" or not array.is_cuda:
        return contextlib.nullcontext()
    torch = sys.modules["torch"]
    if not isinstance(stream, torch.cuda.Stream):
        handle = stream_handle(stream, ("cuda", array.device.index))
        stream = torch.cuda.ExternalStream(handle, device=array.device)
    return torch.cuda.stream(stream)


def _uniform_cum(query, q_len: int):
    """cum_seq_lens_q for a [B, q, H, D] query: B requests of q tokens each, made like the
    query, on its device (seq_lens may state no shape: a bare DLPack capsule); device-side
    arithmetic only, so it is capturable."""
    xp, query = _module(query), _array(query)
    n = query.shape[0] + 1
    if xp.__name__ == "torch":
        return xp.arange(n, dtype=xp.int32, device=query.device) * q_len
    return xp.arange(0, n * q_len, q_len, dtype=xp.int32)


def _new_out(query):
    """An output like the query's tokens and heads, bf16 (engines usually pass one)."""
    xp, query = _module(query), _array(query)
    if not hasattr(query, "shape"):  # a bare DLPack capsule or exporter: nothing to make it like
        raise value_error("out", "an array, or a query that states its shape (an array of NumPy, "
                          "PyTorch or CuPy) to allocate one like",
                          f"None with a query of type {type(query).__name__}")
    shape = tuple(query.shape[:-1]) + (HEAD_DIM,)
    if xp.__name__ == "torch":
        return xp.empty(shape, dtype=xp.bfloat16, device=query.device)
    if xp.__name__ == "cupy":  # no bf16 dtype: its bits, read as bf16
        return Typed(xp.empty(shape, dtype=xp.uint16), "bf16")
    try:
        import ml_dtypes
    except ImportError as e:  # a dependency: absent only where installed without it
        raise import_error("out", "an array, or ml_dtypes installed to allocate a NumPy bf16 one",
                           "None without ml_dtypes") from e
    return xp.empty(shape, dtype=ml_dtypes.bfloat16)


def trtllm_batch_decode_sparse_mla_dsv4(
        *, query, swa_kv_cache, workspace_buffer=None, sparse_indices, sparse_topk_lens,
        seq_lens, out=None, bmm1_scale, bmm2_scale=1.0, sinks=None, compressed_kv_cache=None,
        cum_seq_lens_q=None, max_q_len=None, multi_ctas_kv_counter_buffer=None,
        sparse_indices_are_storage_offsets=True, window=WINDOW, lse=None, stream=None):
    """Sparse MLA decode with the engines' keyword names; returns `out` (allocated when None).

    query [T, H, 512] or [B, q, H, 512] (bf16; e4m3 with a per-tensor fp8 cache), out likewise
    with H_out >= H heads (no need to zero-pad the query's heads), sparse_indices [T, K] or
    [T, 1, K], cum_seq_lens_q [B+1] or None (one token per request, or q per request for a
    [B, q, H, 512] query), max_q_len (required with a device cum_seq_lens_q). Runs on the
    current stream of the query's framework; capturable in a CUDA graph."""
    if not _is_true(sparse_indices_are_storage_offsets):
        raise value_error("sparse_indices_are_storage_offsets",
                          "True (smla reads storage offsets, SPEC §4: (slot / block_size) * span"
                          " + slot % block_size, equal to slots for unpacked pools)",
                          repr(sparse_indices_are_storage_offsets))
    if query is None:
        raise value_error("query", "a [T, H, 512] or [B, q, H, 512] array", "None")
    q_array = _array(query)
    # The named TypeError for what is not an array; not for a bare DLPack capsule, which can be
    # read once only (by the op).
    if not hasattr(q_array, "shape") and not _capsule(q_array):
        tensor(query, "query", takes=QUERY)
    q_len = q_array.shape[1] if getattr(q_array, "ndim", 3) == 4 else 1
    # Nothing is allocated for a query the op refuses by its sizes (it checks them first): a
    # broadcast view (stride 0) may have 2^40 tokens. Not while torch.compile traces: its sizes
    # are symbolic (a test would guard on them, or fail on a data-dependent one), and the op's
    # schema takes an out.
    fits = _torch_compiling() or _query_fits(getattr(q_array, "shape", None))
    uniform = cum_seq_lens_q is None and q_len > 1 and seq_lens is not None
    if uniform:  # the offsets made below count the query's B requests: seq_lens must have B
        shape = getattr(_array(seq_lens), "shape", None)  # no DLPack: torch.compile traces
        if shape is None and not _capsule(_array(seq_lens)):
            # A DLPack producer that states no shape: its import says it (and names what is no
            # array). A bare capsule is read by the op alone, which checks it against the
            # offsets of the query's B.
            shape = tensor(seq_lens, "seq_lens", takes=I32).shape
        shape = None if shape is None else tuple(shape)
        if shape == ():
            tensor(seq_lens, "seq_lens", takes=I32)  # names an array of no dims
        if shape is not None and (len(shape) != 1 or shape[0] != q_array.shape[0]):
            raise value_error("seq_lens", f"[B = {q_array.shape[0]}] (the B of query "
                              f"{shape_text(q_array.shape)}, cum_seq_lens_q absent)",
                              shape_text(shape))
    with _call_stream(query, stream):
        if out is None and fits:
            out = _new_out(query)
        if uniform and fits:
            cum_seq_lens_q = _uniform_cum(query, q_len)
            max_q_len = q_len if max_q_len is None else max_q_len
    result = out
    merged = {}  # the shape the op sees of each array merged here, and the caller's
    query = _merge_tokens(query, "query", 3, merged)
    out = _merge_tokens(out, "out", 3, merged)
    sparse_indices = _merge_tokens(sparse_indices, "sparse_indices", 2, merged)
    if max_q_len is None:
        # Traced, the offsets' values are no trace's: read eagerly, at a graph break.
        read = (sys.modules["torch"].compiler.disable(_max_q_len) if _torch_compiling()
                else _max_q_len)
        max_q_len = 1 if cum_seq_lens_q is None else read(cum_seq_lens_q, seq_lens)
    try:
        sparse_mla_decode(
            query=query, swa_kv_cache=swa_kv_cache, compressed_kv_cache=compressed_kv_cache,
            sparse_indices=sparse_indices, sparse_topk_lens=sparse_topk_lens, seq_lens=seq_lens,
            cum_seq_lens_q=cum_seq_lens_q, max_q_len=max_q_len, sinks=sinks,
            bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale, out=out, lse=lse,
            workspace=workspace_buffer, kv_counters=multi_ctas_kv_counter_buffer, window=window,
            stream=stream)
    except Exception as e:  # named as this call's keywords, not the op's
        raise_renamed(e, _ENGINE_NAMES, {
            name: (shape_text(seen), f"{shape_text(passed)} (its first two dims merged: "
                                     f"{shape_text(seen)})")
            for name, (seen, passed) in merged.items()})
    return result


_ENGINE_NAMES = {"workspace": "workspace_buffer", "kv_counters": "multi_ctas_kv_counter_buffer"}


def _capsule(x) -> bool:
    """Whether x is a bare DLPack capsule (PyTorch's to_dlpack gives one), which the op's import
    uses up: the call must not read it first."""
    return type(x).__name__ == "PyCapsule"


def _is_true(flag) -> bool:
    """True or NumPy's True: never a truthy int, string or array."""
    import numpy as np
    return flag is True or (isinstance(flag, np.bool_) and bool(flag))


def _query_fits(shape) -> bool:
    """Whether the op may take a query of `shape` by its sizes ([T, H, 512], or [B, q, H, 512]
    merged into T = B * q, with T < 2^31 and H in 1..128), which it checks before anything else:
    for another, out and offsets are not made (the op refuses the query). None: not known."""
    if shape is None:
        return True
    shape = tuple(shape)
    if len(shape) not in (3, 4) or shape[-1] != HEAD_DIM:
        return False
    return shape[0] * (shape[1] if len(shape) == 4 else 1) < 2**31 and \
        1 <= shape[-2] <= _smla.MAX_HEADS


_CHUNK = 1 << 20  # offsets diffed at a time: a broadcast view of many is read in bounded memory


def _max_q_len(cum_seq_lens_q, seq_lens) -> int:
    """max_q_len from host offsets; device offsets would need a synchronisation. Offsets the op
    refuses by their shape (not the B + 1 of seq_lens' B) give 1 unread: the op's checks say
    why, and a broadcast view may have 2^40 of them."""
    cum_seq_lens_q = _array(cum_seq_lens_q)
    if on_a_device(cum_seq_lens_q):
        raise value_error("max_q_len", "an int (required with a device cum_seq_lens_q: reading "
                          "it would synchronise)", "None")
    if _capsule(cum_seq_lens_q):
        raise value_error("max_q_len", "an int (required with a cum_seq_lens_q of a bare DLPack "
                          "capsule, which only the op may read)", "None")
    import numpy as np
    try:
        cum = np.asarray(cum_seq_lens_q)
        if cum.dtype == object and hasattr(cum_seq_lens_q, "__dlpack__"):  # DLPack alone
            cum = np.from_dlpack(cum_seq_lens_q)
    except (TypeError, ValueError, BufferError, RuntimeError):
        return 1  # no offsets NumPy reads (a broken __array_interface__): the op's checks say why
    if cum.ndim != 1 or cum.dtype.kind not in "iu":  # no offsets: the op's checks say why
        return 1
    requests = getattr(_array(seq_lens), "shape", None)
    if requests is not None and tuple(requests) != (cum.shape[0] - 1,):
        return 1
    most = 1
    for start in range(0, cum.shape[0] - 1, _CHUNK):
        most = max(most, int(np.diff(cum[start:start + _CHUNK + 1]).max(initial=1)))
    # A step no int32 holds (bits with_dtype reads as i32 otherwise): offsets the op refuses,
    # whose check says why, not max_q_len's (the caller passed none).
    return most if most < 2**31 else 1


def trtllm_decode_sparse_mla_dsv4(*, kv_counters=None, **kwargs):
    """The seeds' wrapper shape: `kv_counters` (from kv_counter_buffer) in place of
    `multi_ctas_kv_counter_buffer` (and so in its errors), indices always storage offsets."""
    try:
        return trtllm_batch_decode_sparse_mla_dsv4(multi_ctas_kv_counter_buffer=kv_counters,
                                                   **kwargs)
    except Exception as e:
        raise_renamed(e, {"multi_ctas_kv_counter_buffer": "kv_counters"})
