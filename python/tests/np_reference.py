"""Float64 NumPy references for the tests, written from SPEC §2 and §4 (not from smla's code).

Pools are given as float64 row getters so that every layout (bf16, per-tensor fp8,
fp8_ds_mla) shares one attention reference.
"""

import os
import secrets

import numpy as np

D = 512

# Bounds of assert_out_close, as tests/oracle.h's: the CPU backend (bf16 rounding of the output
# and float32 dot products) and a CUDA kernel's bf16 arithmetic (the GPU tests here decode bf16
# queries, which every cache layout's kernel runs in bf16).
CPU_TOL = (1 / 256, 1e-5)
DEVICE_TOL = (1e-2, 1e-2)


def fresh_rng():
    """A generator on a fresh seed (SMLA_TEST_SEED replays one), printed: pytest shows it for
    a failed test."""
    seed = int(os.environ.get("SMLA_TEST_SEED", secrets.randbits(63)))
    print(f"seed {seed} (SMLA_TEST_SEED={seed} replays it)")
    return np.random.default_rng(seed)


def assert_out_close(got, want, tol):
    """|got - want| <= rtol |want| + atol * max |want| over each (token, head) row, for
    [..., D] outputs, tol = (rtol, atol). NaN never passes; a zero row (a padded head, an empty
    row, a +inf sink) must be exactly zero."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    rtol, atol = tol
    bound = rtol * np.abs(want) + atol * np.abs(want).max(axis=-1, keepdims=True)
    bad = ~(np.abs(got - want) <= bound)
    if bad.any():
        where = [tuple(int(i) for i in w) for w in np.argwhere(bad)[:8]]
        raise AssertionError(f"{int(bad.sum())} elements out of bounds, first at " + ", ".join(
            f"{w}: {got[w]!r} vs {want[w]!r}" for w in where))


class Pool:
    """A pool's rows as float64: `rows[block, i]` for i < block_size, addressed by storage
    offsets `block * span + i` (SPEC §4)."""

    def __init__(self, rows: np.ndarray, span: int):
        self.rows, self.span = rows, span
        self.num_blocks, self.block_size = rows.shape[:2]

    def row(self, offset: int):
        """The row an offset reads, or None when it is padding or outside the pool."""
        if offset < 0 or offset >= self.num_blocks * self.span:
            return None
        block, i = divmod(offset, self.span)
        return self.rows[block, i] if i < self.block_size else None

    def where(self, offset: int):
        block, i = divmod(offset, self.span)
        return block, i


def attended(t, pos, sparse_indices, sparse_topk_lens, window, swa, compressed):
    """The (pool, offset) pairs token t attends (SPEC §2 rules 1-3), in column order."""
    swa_len = min(pos + 1, window)
    picked = []
    for c in range(min(int(sparse_topk_lens[t]), sparse_indices.shape[1])):
        if c < window and c >= swa_len:
            continue
        pool = swa if c < window else compressed
        offset = int(sparse_indices[t, c])
        if pool.row(offset) is not None:
            picked.append((pool, offset))
    return picked


def positions(seq_lens, cum_seq_lens_q, num_tokens):
    """pos(t) of every token (SPEC §1)."""
    if cum_seq_lens_q is None:
        cum_seq_lens_q = np.arange(num_tokens + 1)
    pos = np.zeros(num_tokens, dtype=np.int64)
    for b in range(len(seq_lens)):
        start, end = int(cum_seq_lens_q[b]), int(cum_seq_lens_q[b + 1])
        pos[start:end] = int(seq_lens[b]) - (end - start) + np.arange(end - start)
    return pos


def decode(query, swa, compressed, sparse_indices, sparse_topk_lens, seq_lens, cum_seq_lens_q,
           sinks, bmm1_scale, bmm2_scale, out_heads, window=128):
    """(out [T, H_out, D], lse [T, H]) in float64; query is float64 [T, H, D]."""
    num_tokens, num_heads, _ = query.shape
    compressed = compressed or swa
    out = np.zeros((num_tokens, out_heads, D))
    lse = np.full((num_tokens, num_heads), -np.inf)
    pos = positions(seq_lens, cum_seq_lens_q, num_tokens)
    sink = np.full(num_heads, -np.inf) if sinks is None else np.asarray(sinks, np.float64)
    for t in range(num_tokens):
        picked = attended(t, pos[t], sparse_indices, sparse_topk_lens, window, swa, compressed)
        if not picked:
            continue
        kv = np.stack([pool.row(o) for pool, o in picked])   # [n, D]
        s = bmm1_scale * (query[t] @ kv.T)                    # [H, n]
        s_max = s.max(axis=1)
        lse[t] = s_max + np.log(np.exp(s - s_max[:, None]).sum(axis=1))
        for h in range(num_heads):
            if sink[h] == np.inf:
                continue  # output 0
            m = max(s_max[h], sink[h])
            p = np.exp(s[h] - m)
            denom = p.sum() + (np.exp(sink[h] - m) if sink[h] > -np.inf else 0.0)
            out[t, h] = bmm2_scale * (p @ kv) / denom
    return out, lse


def storage_offset(slot, block_size, span):
    """SPEC §4: (slot / block_size) * span + slot % block_size; negatives stay."""
    if slot < 0:
        return slot
    return (slot // block_size) * span + slot % block_size


def slot(block_table_row, position, block_size):
    return int(block_table_row[position // block_size]) * block_size + position % block_size


def decode_table(seq_lens, cum_seq_lens_q, num_tokens, block_table, swa_block_size, swa_span,
                 window, compress_ratio=0, topk_indices=None, compressed_block_table=None,
                 entries_per_page=0, compressed_span=0, is_valid_token=None):
    """SPEC §4 rows of decode tokens: (sparse_indices [T, K], sparse_topk_lens [T])."""
    top_k = topk_indices.shape[1] if compress_ratio > 0 else 0
    num_columns = window + (top_k + 3) // 4 * 4
    indices = np.full((num_tokens, num_columns), -1, dtype=np.int32)
    lens = np.zeros(num_tokens, dtype=np.int32)
    pos = positions(seq_lens, cum_seq_lens_q, num_tokens)
    request = np.zeros(num_tokens, dtype=np.int64)
    cum = np.arange(num_tokens + 1) if cum_seq_lens_q is None else cum_seq_lens_q
    for b in range(len(seq_lens)):
        request[int(cum[b]):int(cum[b + 1])] = b
    for t in range(num_tokens):
        valid = is_valid_token is None or bool(is_valid_token[t])
        r = request[t]
        if valid:
            start = max(pos[t] - window + 1, 0)
            for i in range(pos[t] - start + 1):
                s = slot(block_table[r], start + i, swa_block_size)
                indices[t, i] = storage_offset(s, swa_block_size, swa_span)
        count = 0
        if compress_ratio > 0 and valid:
            for j, x in enumerate(topk_indices[t]):
                if x < 0:
                    indices[t, window + j] = x  # negatives stay as they are
                    continue
                count += 1
                s = (int(compressed_block_table[r][x // entries_per_page]) * entries_per_page
                     + x % entries_per_page)
                indices[t, window + j] = storage_offset(s, entries_per_page, compressed_span)
        lens[t] = window + count
    return indices, lens


def dspark_table(seq_lens, cum_seq_lens_q, num_tokens, block_table, swa_block_size, swa_span,
                 window, num_columns, is_valid_token=None):
    """DSpark rows (decode_swa_width > window, SWA-only): every token of a request's draft block
    of q_len tokens sees positions [max(seq_len - q_len - window, 0), seq_len), in columns 0..,
    -1 past them, length max(their count, window), and becomes a request of its own of that
    seq_len. (sparse_indices [T, K], sparse_topk_lens [T], seq_lens [T])."""
    indices = np.full((num_tokens, num_columns), -1, dtype=np.int32)
    lens = np.full(num_tokens, window, dtype=np.int32)
    token_seq_lens = np.zeros(num_tokens, dtype=np.int32)
    for b in range(len(seq_lens)):
        start, end = int(cum_seq_lens_q[b]), int(cum_seq_lens_q[b + 1])
        seq_len = int(seq_lens[b])
        first = max(seq_len - (end - start) - window, 0)
        for t in range(start, end):
            token_seq_lens[t] = seq_len
            if is_valid_token is not None and not is_valid_token[t]:
                continue
            for i, position in enumerate(range(first, seq_len)):
                s = slot(block_table[b], position, swa_block_size)
                indices[t, i] = storage_offset(s, swa_block_size, swa_span)
            lens[t] = max(seq_len - first, window)
    return indices, lens, token_seq_lens
