"""Persistent CUDA buffers for the decode op (SPEC §3), one of each per device, as PyTorch
tensors: allocated and zeroed outside any graph capture, grown only, shared by every caller in
the process. Launches that use them must not overlap (one stream, as a model's layers run);
launches on streams that may overlap need buffers of their own."""

import sys
import threading

from . import _smla
from ._arrays import parse_device
from ._errors import import_error, runtime_error
from .decode import kv_counter_bytes, workspace_bytes

_buffers = {}  # (kind, torch.device) -> uint8 tensor
# Replaced buffers stay alive: a captured graph keeps their addresses, not a reference.
_retired = []
# Held while a buffer is looked up and grown: torch.zeros and the synchronisation let another
# thread run, whose buffer this one's would otherwise replace without retiring it.
_lock = threading.Lock()


def _device(device, caller: str):
    """A torch.device for any device parse_device takes (None: the current CUDA device); an
    ImportError naming `caller` without PyTorch."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError as e:
            raise import_error(caller, "PyTorch installed (the buffer is a torch tensor)",
                               "no module torch") from e
    kind, index = parse_device("cuda" if device is None else device)
    return torch.device(kind, index) if kind == "cuda" else torch.device("cpu")


def _zeroed(kind: str, nbytes: int, device):
    device = _device(device, kind)  # imports torch
    torch = sys.modules["torch"]
    with _lock:
        buffer = _buffers.get((kind, device))
        if buffer is not None and buffer.numel() >= nbytes:
            return buffer
        if device.type == "cuda":
            with torch.cuda.device(device):  # the buffer's device's current stream
                capturing = torch.cuda.is_current_stream_capturing()
            if capturing:
                raise runtime_error(kind, f"a buffer of {nbytes} B made before graph capture "
                                    f"(call {kind} once with the largest shape first)",
                                    "a call during capture")
        fresh = torch.zeros(max(nbytes, 1), dtype=torch.uint8, device=device)
        if device.type == "cuda":
            # Launches may come on another stream than the one that zeroed it.
            torch.cuda.current_stream(device).synchronize()
        if buffer is not None:
            _retired.append(buffer)
        _buffers[(kind, device)] = fresh
        return fresh


def kv_counter_buffer(max_tokens: int, num_heads: int = _smla.MAX_HEADS, device=None):
    """Zeroed multi-CTA KV counters (a uint8 torch tensor) on `device` (default: the current
    CUDA device) for launches of up to `max_tokens` tokens of up to `num_heads` heads. Every
    launch leaves them zero, so they are zeroed once; launches that overlap on one buffer race.
    """
    return _zeroed("kv_counter_buffer", kv_counter_bytes(max_tokens, num_heads), device)


def workspace_buffer(max_tokens: int, num_heads: int, max_columns: int, device=None):
    """Split-KV workspace (a uint8 torch tensor) for launches of up to `max_tokens` tokens,
    exactly `num_heads` heads and any width up to `max_columns` (workspace_bytes covers every
    narrower width, not fewer heads: those may need more). Smaller or absent is not an error:
    launches then split less."""
    dev = _device(device, "workspace_buffer")
    where = ("cuda", dev.index) if dev.type == "cuda" else ("cpu", 0)
    return _zeroed("workspace_buffer", workspace_bytes(max_tokens, num_heads, max_columns, where),
                   dev)
