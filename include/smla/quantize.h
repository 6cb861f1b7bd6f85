// Writing KV rows into a pool (SPEC §2 KV dtypes): one call fills a pool of any layout with
// what the decode op reads, e.g. the new tokens' KV before attention, or a test's cache.
#pragma once
#include "smla/decode.h"
#include "smla/tensor.h"

namespace smla {

// Writes row i of `rows` into slot slots[i] of `pool`, encoded in the pool's layout:
//   bf16 pool:                the bf16 bits, unchanged;
//   f8e4m3 pool (fp8_e4m3):   e4m3(x / kv_scale) — decode it with bmm2_scale = kv_scale and
//                             kv_scale folded into bmm1_scale (SPEC §2);
//   u8 pool (fp8_ds_mla):     the 448 NoPE values as e4m3 under one UE8M0 scale per 64 values
//                             (the smallest power of two that avoids saturation), the 64 RoPE
//                             values as bf16, the pad byte 0.
// docs/decode.md ("Quantizers") has the rounding rules. A slot is SPEC §4's
// `page * block_size + i`: the row lands where the decode op reads storage offset
// `page * span + i`. Only the row's record (and fp8_ds_mla's scale record) is written.
//
//   rows      [N, 512] bf16, last dim contiguous
//   slots     [N] i32; negative = padding (skipped); else < num_blocks * block_size, distinct
//   pool      a KV pool as sparse_mla_decode takes it (decode.h), apart from rows and slots;
//             its device is the call's
//   kv_scale  finite and > 0 for every layout; used by fp8_e4m3 pools only
//
// Runs on the device of its tensors (on CUDA the current device). Throws smla::Error naming
// the first bad argument, before anything is written. Slot values are checked for host tensors
// only: on CUDA (one kernel launch on `stream`, capturable, the same bytes as the CPU) a row
// whose slot is >= num_blocks * block_size is skipped like padding, and rows sharing a slot
// leave its bytes undefined.
void quantize_kv(const TensorView& rows, const TensorView& slots, const TensorView& pool,
                 float kv_scale = 1.0f, void* stream = nullptr);

}  // namespace smla
