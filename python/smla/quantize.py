"""Writing KV rows into a pool of any layout (include/smla/quantize.h)."""

from . import _smla
from ._arrays import BF16, I32, POOL, device_of, on_device, scale, stream_handle, tensor
from ._traced import as_torch_op


@as_torch_op("quantize_kv", lambda kwargs: {k: v for k, v in kwargs.items() if k != "stream"},
             ("kv_scale",))
def quantize_kv(*, rows, slots, pool, kv_scale=1.0, stream=None) -> None:
    """Writes row i of `rows` (bf16 [N, 512]) into slot `slots[i]` (i32, SPEC §4's
    `page * block_size + i`; negative = skipped) of `pool`, encoded in the pool's layout: bf16
    as is, f8e4m3 as e4m3(x / kv_scale), u8 (fp8_ds_mla) as e4m3 NoPE values under one UE8M0
    scale per 64 plus bf16 RoPE values (docs/decode.md, "Quantizers"). Bad input raises
    TypeError / ValueError naming the argument, before anything is written. On CUDA it is one
    kernel on `stream` (default: the current stream of the rows' framework) writing the CPU's
    bytes; slot values are not read on the host there, and a slot past the pool is skipped.
    Traced by torch.compile (torch tensors, a float scale, no `stream`), it is
    torch.ops.smla.quantize_kv."""
    r = tensor(rows, "rows", required="bf16 rows [N, 512]", takes=BF16)
    device = device_of(r)
    args = dict(rows=r, slots=tensor(slots, "slots", takes=I32),
                pool=tensor(pool, "pool", writable=True, takes=POOL),
                kv_scale=scale(kv_scale, "kv_scale"), stream=stream_handle(stream, device, rows))
    with on_device(device, rows):
        _smla.quantize_kv(**args)
