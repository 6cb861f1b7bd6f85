"""The smla package on the CPU backend with NumPy arrays (CI), against the float64 references
in np_reference.py, on fresh random inputs, outputs poisoned with NaN before each call, and
every pool row that no attended column points to poisoned too."""

import ctypes
import dataclasses
import decimal
import fractions
import gc
import importlib.util
import math
import re
import sys
import threading
import time
import tracemalloc
import weakref

import ml_dtypes
import numpy as np
import pytest

import smla
from smla.engine import trtllm_batch_decode_sparse_mla_dsv4, trtllm_decode_sparse_mla_dsv4

import np_reference as ref
from step_layers import four_layers

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
D = 512
W = 128


# ---------------------------------------------------------------------------------------------
# Case construction
# ---------------------------------------------------------------------------------------------

def bf16_pool(rng, blocks, block_size, span, dtype=BF16):
    """A pool view [blocks, block_size, 512] over pages of `span` rows (the rest is other data,
    NaN), and its reference rows."""
    pages = np.full((blocks, span, D), np.nan, dtype=np.float32).astype(dtype)
    values = (rng.standard_normal((blocks, block_size, D)) * (1.0 if dtype == BF16 else 4.0))
    pages[:, :block_size] = values.astype(dtype)
    view = pages[:, :block_size]
    return view, ref.Pool(view.astype(np.float64), span)


def random_offsets(rng, pool, shape):
    """Storage offsets: mostly rows of the pool, some -1, some past the pool, some into the
    packed gap of a page (masked like offsets past the pool)."""
    blocks, block_size, span = pool.num_blocks, pool.block_size, pool.span
    good = rng.integers(0, blocks, shape) * span + rng.integers(0, block_size, shape)
    kind = rng.random(shape)
    out = np.where(kind < 0.08, -1, good)
    out = np.where((kind >= 0.08) & (kind < 0.14), blocks * span + rng.integers(0, 50, shape), out)
    if span > block_size:
        gap = rng.integers(0, blocks, shape) * span + rng.integers(block_size, span, shape)
        out = np.where((kind >= 0.14) & (kind < 0.18), gap, out)
    return out.astype(np.int32)


def make_case(rng, q_lens=(1, 3, 2), seq_lens=(5, 300, 140), heads=8, out_heads=None, top_p=32,
              block_size=16, span=20, separate_pools=True, sinks="finite", lse=True):
    """Keyword arguments of smla.sparse_mla_decode plus what the reference needs."""
    out_heads = out_heads or heads
    num_tokens = sum(q_lens)
    cum = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    swa_view, swa = bf16_pool(rng, 12, block_size, span)
    comp_view, comp = bf16_pool(rng, 9, block_size, span + 4) if separate_pools else (None, None)
    num_columns = W + top_p
    indices = np.concatenate(
        [random_offsets(rng, swa, (num_tokens, W)),
         random_offsets(rng, comp or swa, (num_tokens, top_p))], axis=1)
    lens = rng.integers(W - 8, num_columns + 1, num_tokens).astype(np.int32)
    sink_values = {
        None: None,
        "-inf": np.full(heads, -np.inf, np.float32),
        "finite": rng.standard_normal(heads).astype(np.float32) * 2,
        "+inf": np.full(heads, np.inf, np.float32),
        "mixed": np.resize(np.array([-np.inf, 0.5, np.inf, -3.0], np.float32), heads),
    }[sinks]
    query = (rng.standard_normal((num_tokens, heads, D))).astype(BF16)
    args = dict(
        query=query, swa_kv_cache=swa_view, compressed_kv_cache=comp_view,
        sparse_indices=indices, sparse_topk_lens=lens, seq_lens=np.array(seq_lens, np.int32),
        cum_seq_lens_q=cum, max_q_len=max(q_lens), sinks=sink_values,
        bmm1_scale=1 / math.sqrt(D), bmm2_scale=1.0,
        out=np.full((num_tokens, out_heads, D), np.nan, np.float32).astype(BF16),
        lse=np.full((num_tokens, heads), np.nan, np.float32) if lse else None)
    return args, {"swa": swa, "comp": comp}


def reference(args, pools, query64=None):
    query64 = args["query"].astype(np.float64) if query64 is None else query64
    return ref.decode(query64, pools["swa"], pools["comp"], args["sparse_indices"],
                      args["sparse_topk_lens"], args["seq_lens"], args["cum_seq_lens_q"],
                      args["sinks"], args["bmm1_scale"], args["bmm2_scale"],
                      args["out"].shape[1], args.get("window", W))


def poison_unread(args, pools, poison=None):
    """NaN into every row of the smla-facing pools that no attended column points to: such
    rows must not reach the output (SPEC §2). `poison(view, block, i)` for other layouts."""
    swa, comp = pools["swa"], pools["comp"] or pools["swa"]
    window = args.get("window", W)
    read = {id(swa): set(), id(comp): set()}
    pos = ref.positions(args["seq_lens"], args["cum_seq_lens_q"], args["query"].shape[0])
    for t in range(args["query"].shape[0]):
        for pool, offset in ref.attended(t, pos[t], args["sparse_indices"],
                                         args["sparse_topk_lens"], window, swa, comp):
            read[id(pool)].add(pool.where(offset))
    views = [(args["swa_kv_cache"], swa)]
    if args["compressed_kv_cache"] is not None:
        views.append((args["compressed_kv_cache"], comp))
    for view, pool in views:
        for block in range(pool.num_blocks):
            for i in range(pool.block_size):
                if (block, i) in read[id(pool)]:
                    continue
                if poison:
                    poison(view, block, i)
                else:
                    view[block, i] = np.nan


def check(args, expected_out, expected_lse, heads):
    out = args["out"].astype(np.float64)
    assert np.isfinite(out).all(), "NaN or Inf reached the output"
    ref.assert_out_close(out[:, :heads], expected_out[:, :heads], ref.CPU_TOL)
    assert (out[:, heads:] == 0).all(), "padded heads must be zeros"
    if args["lse"] is not None:
        # float32 sums of exact bf16 products: the C++ CPU tests' bound, NaN never accepted
        np.testing.assert_allclose(args["lse"], expected_lse, rtol=1e-5, atol=1e-5,
                                   equal_nan=False)


def run_and_check(args, pools, query64=None):
    expected_out, expected_lse = reference(args, pools, query64)
    poison_unread(args, pools)
    smla.sparse_mla_decode(**args)
    check(args, expected_out, expected_lse, args["query"].shape[1])


def rerun_writes_the_same_out(args, **changes):
    """True where the op, run again with `changes` over a NaN-poisoned out, writes the bits the
    out held (changes may pass views of args["out"] as the out)."""
    first = args["out"].copy()
    args["out"][:] = np.nan
    smla.sparse_mla_decode(**dict(args, **changes))
    return (args["out"].view(np.uint16) == first.view(np.uint16)).all()


# ---------------------------------------------------------------------------------------------
# The decode op
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("trial", range(3))
def test_decode_varlen(trial):
    args, pools = make_case(ref.fresh_rng())
    run_and_check(args, pools)


@pytest.mark.parametrize("sinks", [None, "-inf", "finite", "+inf", "mixed"])
def test_decode_sinks(sinks):
    args, pools = make_case(ref.fresh_rng(), sinks=sinks)
    run_and_check(args, pools)
    if sinks == "+inf":
        assert (args["out"].astype(np.float32) == 0).all()


def test_decode_window_other_than_128():
    """A window of 64: columns [0, 64) are SWA (each token's last min(pos + 1, 64)), the rest
    compressed."""
    args, pools = make_case(ref.fresh_rng())
    args["window"] = 64
    run_and_check(args, pools)


def test_decode_scales_down_to_float32_subnormals():
    """A scale float32 holds only as a subnormal (down to 1.4e-45) is taken, not refused: it
    scales the output alone, so lse is the bmm2_scale = 1 call's."""
    args, pools = make_case(ref.fresh_rng())
    run_and_check(args, pools)
    ulp = 2.0 ** -133  # bf16's smallest subnormal: an output's rounding is half of it
    for bmm2 in (1e-40, 1.401298464324817e-45):
        tiny = dict(args, bmm2_scale=bmm2, out=np.full_like(args["out"], np.nan),
                    lse=np.full_like(args["lse"], np.nan))
        expected_out, _ = reference(tiny, pools)
        smla.sparse_mla_decode(**tiny)
        out = tiny["out"].astype(np.float64)
        assert np.isfinite(out).all()
        assert np.abs(out - expected_out).max() <= ulp, bmm2
        # 1e-40 times outputs of O(1) leaves bf16 subnormals, not zeros; 1.4e-45 rounds to 0
        assert (out != 0).any() == (bmm2 > ulp), bmm2
        assert (tiny["lse"].view(np.uint32) == args["lse"].view(np.uint32)).all()


def test_decode_padded_heads():
    args, pools = make_case(ref.fresh_rng(), heads=5, out_heads=16)
    run_and_check(args, pools)


def test_decode_one_token_per_request_and_shared_pool():
    args, pools = make_case(ref.fresh_rng(), q_lens=(1, 1, 1, 1),
                            seq_lens=(1, 64, 129, 700), separate_pools=False)
    args["cum_seq_lens_q"] = None
    args["max_q_len"] = 1
    run_and_check(args, pools)


def test_decode_empty_rows_give_zero_and_minus_inf_lse():
    args, pools = make_case(ref.fresh_rng())
    args["sparse_topk_lens"][:] = 0
    args["sparse_topk_lens"][2] = W + 32
    run_and_check(args, pools)
    empty = [t for t in range(args["query"].shape[0]) if t != 2]
    assert (args["out"][empty].astype(np.float32) == 0).all()
    assert np.isneginf(args["lse"][empty]).all()


def test_decode_offsets_past_the_pool_are_masked():
    args, pools = make_case(ref.fresh_rng())
    args["sparse_indices"][:, ::3] = 10**9
    args["sparse_indices"][:, 1::7] = -7
    run_and_check(args, pools)


def test_decode_strided_views_cross_without_copies():
    rng = ref.fresh_rng()
    args, pools = make_case(rng, heads=4, out_heads=6)
    # Every other head of a wider query, and rows of a wider index table.
    wide_q = np.full((args["query"].shape[0], 8, D), np.nan, np.float32).astype(BF16)
    wide_q[:, ::2] = args["query"]
    args["query"] = wide_q[:, ::2]
    wide_idx = np.zeros((args["sparse_indices"].shape[0], 2 * args["sparse_indices"].shape[1]),
                        np.int32)
    wide_idx[:, :args["sparse_indices"].shape[1]] = args["sparse_indices"]
    args["sparse_indices"] = wide_idx[:, :args["sparse_indices"].shape[1]]
    wide_out = np.full((args["out"].shape[0], 12, D), np.nan, np.float32).astype(BF16)
    args["out"] = wide_out[:, 3:9]
    run_and_check(args, pools)
    for outside in (wide_out[:, :3], wide_out[:, 9:]):
        assert np.isnan(outside.astype(np.float32)).all(), "wrote outside the out view"


def test_size_one_dims_take_any_stride():
    """A one-page pool and a pool of one row a page are read at index 0 of that dim alone: any
    stride there (PyTorch up to 2.9 exports such strides as 1) gives the row-major bits."""
    rng = ref.fresh_rng()
    args, _ = make_case(rng, q_lens=(1,), seq_lens=(300,), separate_pools=False)
    as_strided = np.lib.stride_tricks.as_strided
    for shape in [(1, 64, D), (64, 1, D)]:
        pool = rng.standard_normal(shape).astype(BF16)
        odd = as_strided(pool, shape, tuple(2 if n == 1 else st
                                            for n, st in zip(shape, pool.strides)))
        indices = rng.integers(-1, 64, args["sparse_indices"].shape).astype(np.int32)
        outs = []
        for view in (pool, odd):
            out = np.full_like(args["out"], np.nan)
            smla.sparse_mla_decode(**dict(args, swa_kv_cache=view, sparse_indices=indices,
                                          out=out, lse=None))
            outs.append(out.view(np.uint16))
        assert np.isfinite(outs[0].view(BF16).astype(np.float32)).all()
        assert (outs[0] == outs[1]).all(), shape


def test_pools_with_a_dim_of_one_decode_as_three_dim_ones():
    """A pool [blocks, block_size, 1, 512] (a KV cache that keeps its one head) is read as the
    [blocks, block_size, 512] one: 4 dims are within what an array may have."""
    args, pools = make_case(ref.fresh_rng())
    run_and_check(args, pools)
    assert rerun_writes_the_same_out(
        args, swa_kv_cache=args["swa_kv_cache"][:, :, None],
        compressed_kv_cache=args["compressed_kv_cache"][:, :, None])


def test_zero_strides_beside_a_dim_of_one_are_kept():
    """Only an empty array's zero strides are made row-major: a one-token query broadcast over
    its heads (stride 0) reads its one row for every head, and an lse of stride 0 over heads is
    refused (its heads would all be one float), never written as if row-major."""
    rng = ref.fresh_rng()
    args, pools = make_case(rng, q_lens=(1,), seq_lens=(300,))
    # A view of the whole query: were its strides made row-major, the reads stay inside it.
    broadcast = np.broadcast_to(args["query"][:, :1], args["query"].shape)
    args["query"] = np.ascontiguousarray(broadcast)
    run_and_check(args, pools)
    assert rerun_writes_the_same_out(args, query=broadcast)
    lse = np.lib.stride_tricks.as_strided(args["lse"], strides=(args["lse"].strides[0], 0))
    with pytest.raises(ValueError, match=r"^smla: lse: expected a contiguous last dim "
                       r"\(stride 1\), got stride 0$") as info:
        smla.sparse_mla_decode(**bad(args, lse=lse))
    assert info.value.argument == "lse"


def test_decode_raw_bits_with_dtype_give_the_same_result():
    args, pools = make_case(ref.fresh_rng(), sinks=None)
    run_and_check(args, pools)
    assert rerun_writes_the_same_out(
        args, query=smla.with_dtype(args["query"].view(np.uint16), "bf16"),
        swa_kv_cache=smla.with_dtype(args["swa_kv_cache"].view(np.uint16), "bf16"),
        compressed_kv_cache=smla.with_dtype(args["compressed_kv_cache"].view(np.uint16), "bf16"),
        out=smla.with_dtype(args["out"].view(np.uint16), "bf16"))


class EngineArray(np.ndarray):
    """An engine's own array type: a NumPy array all the same."""


def test_decode_takes_array_subclasses():
    """An ndarray subclass of ml_dtypes' bfloat16 is read as bf16, as its base class is."""
    args, pools = make_case(ref.fresh_rng(), sinks=None)
    run_and_check(args, pools)
    assert rerun_writes_the_same_out(args, query=args["query"].view(EngineArray),
                                     out=args["out"].view(EngineArray))


def test_with_dtype_element_sizes_must_agree():
    """with_dtype reads an array's bits as another dtype of the same element size only; it
    also names the dtype of an ml_dtypes array (which is read as that, not as its own), by
    that dtype's name, not by the integers its bits cross as."""
    args, _ = make_case(ref.fresh_rng())
    with pytest.raises(TypeError, match="smla: query: expected 16-bit elements to read as bf16, "
                       "got uint8"):
        smla.sparse_mla_decode(**dict(args, query=smla.with_dtype(args["query"].view(np.uint8),
                                                                   "bf16")))
    with pytest.raises(TypeError, match="smla: query: expected 8-bit elements to read as "
                       "f8e4m3, got bfloat16$"):
        smla.sparse_mla_decode(**dict(args, query=smla.with_dtype(args["query"], "f8e4m3")))
    fp8 = args["query"].astype(np.float32).astype(E4M3)
    with pytest.raises(TypeError, match="smla: query: expected 16-bit elements to read as "
                       "bf16, got float8_e4m3fn$"):
        smla.sparse_mla_decode(**dict(args, query=smla.with_dtype(fp8, "bf16")))
    # 16 bits, but in two lanes of a vector type: not one 16-bit element.
    query = DlpackExport(args["query"].view(np.uint16), CPU, UINT, lanes=2)
    with pytest.raises(TypeError, match="smla: query: expected 16-bit elements to read as bf16, "
                       "got uint16x2"):
        smla.sparse_mla_decode(**dict(args, query=smla.with_dtype(query, "bf16")))


def test_decode_fp8_per_tensor():
    rng = ref.fresh_rng()
    args, pools = make_case(rng, separate_pools=False, sinks="finite")
    view, pool = bf16_pool(rng, 12, 16, 20, dtype=E4M3)
    q_scale, kv_scale = 0.25, 0.5
    query = (rng.standard_normal(args["query"].shape) * 4).astype(E4M3)
    args.update(query=query, swa_kv_cache=view, bmm1_scale=D**-0.5 * q_scale * kv_scale,
                bmm2_scale=kv_scale)
    pools = {"swa": pool, "comp": None}
    run_and_check(args, pools)


def ds_mla_pool(rng, blocks, block_size):
    """An fp8_ds_mla pool (SPEC §2): per page, block_size 576-B records (448 e4m3 + 64 bf16),
    then block_size 8-B scale records (7 UE8M0 + pad); page size padded to 576 B."""
    record, scales = 576, 8
    page = -(-block_size * (record + scales) // record) * record
    buf = np.zeros((blocks, page), np.uint8)
    nope = (rng.standard_normal((blocks, block_size, 448)) * 8).astype(E4M3)
    rope = rng.standard_normal((blocks, block_size, 64)).astype(BF16)
    exps = rng.integers(120, 131, (blocks, block_size, 7)).astype(np.uint8)
    records = buf[:, :block_size * record].reshape(blocks, block_size, record)
    records[:, :, :448] = nope.view(np.uint8)
    records[:, :, 448:] = rope.view(np.uint8).reshape(blocks, block_size, 128)
    scale_recs = buf[:, block_size * record:block_size * (record + scales)]
    scale_recs.reshape(blocks, block_size, scales)[:, :, :7] = exps
    rows = np.concatenate(
        [nope.astype(np.float64) * np.repeat(2.0 ** (exps.astype(np.float64) - 127), 64, axis=2),
         rope.astype(np.float64)], axis=2)
    view = np.lib.stride_tricks.as_strided(buf, shape=(blocks, block_size, 584),
                                           strides=(page, 584, 1))
    return buf, view, ref.Pool(rows, block_size)


def poison_ds_mla(buf, block_size):
    """poison_unread's poison for an fp8_ds_mla page buffer: the record's bytes 0xFF (NaN as
    e4m3 and as bf16)."""
    def poison(view, block, i):
        buf[block, i * 576:(i + 1) * 576] = 0xFF
    return poison


def test_decode_fp8_ds_mla():
    rng = ref.fresh_rng()
    args, _ = make_case(rng, separate_pools=False)
    buf, view, pool = ds_mla_pool(rng, 12, 16)
    args["swa_kv_cache"] = view
    args["sparse_indices"] = np.concatenate(
        [random_offsets(rng, pool, (args["query"].shape[0], W + 32))], axis=1)
    pools = {"swa": pool, "comp": None}
    expected_out, expected_lse = reference(args, pools)
    poison_unread(args, pools, poison_ds_mla(buf, 16))
    smla.sparse_mla_decode(**args)
    check(args, expected_out, expected_lse, args["query"].shape[1])


# ---------------------------------------------------------------------------------------------
# Errors name the argument
# ---------------------------------------------------------------------------------------------

def bad(args, **changes):
    return dict(args, **changes)


@pytest.mark.parametrize("change,error,argument", [
    (lambda a: bad(a, query=a["query"].astype(np.float32)), TypeError, "query"),
    (lambda a: bad(a, query=a["query"].view(np.uint16)), TypeError, "query"),
    (lambda a: bad(a, sparse_indices=a["sparse_indices"][:, :W + 2]), ValueError,
     "sparse_indices"),
    (lambda a: bad(a, sparse_indices=a["sparse_indices"].astype(np.int64)), TypeError,
     "sparse_indices"),
    (lambda a: bad(a, sparse_topk_lens=a["sparse_topk_lens"] + 1000), ValueError,
     "sparse_topk_lens"),
    (lambda a: bad(a, seq_lens=np.array([0, 300, 140], np.int32)), ValueError, "seq_lens"),
    (lambda a: bad(a, max_q_len=1), ValueError, "max_q_len"),
    (lambda a: bad(a, cum_seq_lens_q=np.array([0, 3, 1, 6], np.int32)), ValueError,
     "cum_seq_lens_q"),
    (lambda a: bad(a, sinks=np.zeros(3, np.float32)), ValueError, "sinks"),
    (lambda a: bad(a, out=a["out"][:, :4]), ValueError, "out"),
    (lambda a: bad(a, out=a["out"].astype(np.float32)), TypeError, "out"),
    (lambda a: bad(a, lse=a["lse"][:, :2]), ValueError, "lse"),
    (lambda a: bad(a, bmm1_scale=float("nan")), ValueError, "bmm1_scale"),
    (lambda a: bad(a, bmm2_scale="x"), TypeError, "bmm2_scale"),
    (lambda a: bad(a, bmm1_scale="0.04"), TypeError, "bmm1_scale"),  # never parsed
    (lambda a: bad(a, bmm2_scale=b"1"), TypeError, "bmm2_scale"),
    (lambda a: bad(a, bmm2_scale=np.ones(2, np.float32)), TypeError, "bmm2_scale"),
    (lambda a: bad(a, swa_kv_cache=a["swa_kv_cache"][:, :, :256]), ValueError, "swa_kv_cache"),
    (lambda a: bad(a, compressed_kv_cache=a["compressed_kv_cache"].view(np.uint16)), TypeError,
     "compressed_kv_cache"),
    (lambda a: bad(a, swa_kv_cache=[1, 2, 3]), TypeError, "swa_kv_cache"),
    (lambda a: bad(a, window=0), ValueError, "window"),
    (lambda a: bad(a, window=128.9), TypeError, "window"),  # never truncated
    (lambda a: bad(a, max_q_len=3.7), TypeError, "max_q_len"),
    (lambda a: bad(a, bmm1_scale=True), TypeError, "bmm1_scale"),
    (lambda a: bad(a, bmm2_scale=np.bool_(True)), TypeError, "bmm2_scale"),
    (lambda a: bad(a, bmm1_scale=1e39), ValueError, "bmm1_scale"),  # not made inf
    (lambda a: bad(a, bmm2_scale=1e-50), ValueError, "bmm2_scale"),  # nor 0
    (lambda a: bad(a, bmm1_scale=10**400), ValueError, "bmm1_scale"),
    (lambda a: bad(a, bmm1_scale=fractions.Fraction(1, 10**400)), ValueError, "bmm1_scale"),
    (lambda a: bad(a, bmm2_scale=decimal.Decimal("-1e-400")), ValueError, "bmm2_scale"),
    (lambda a: bad(a, query=None), ValueError, "query"),
    (lambda a: bad(a, max_q_len=2**31), ValueError, "max_q_len"),  # never wrapped
    (lambda a: bad(a, seq_lens=np.zeros(0, np.int32), cum_seq_lens_q=np.zeros(1, np.int32)),
     ValueError, "seq_lens"),  # tokens of no request
    (lambda a: bad(a, window=np.int64(-2**40)), ValueError, "window"),
    (lambda a: bad(a, lse=a["out"][:, 0, :16].view(np.float32)), ValueError, "out"),  # in out
])
def test_decode_errors_name_the_argument(change, error, argument):
    args, _ = make_case(ref.fresh_rng())
    with pytest.raises(error, match=f"smla: {argument}:") as info:
        smla.sparse_mla_decode(**change(args))
    assert info.value.argument == argument



def test_scales_refuse_text_and_bools_inside_arrays():
    """A one-element array of text or of a bool is no scale, as a str or a bool is not: float()
    of its item would parse the text ("0.04" as 0.04) and read True as 1.0 (a fuzzer's finding:
    they were taken); nor is a NumPy time."""
    args, _ = make_case(ref.fresh_rng())
    _, layers, _, _ = _executor_case(ref.fresh_rng())
    quantize = dict(rows=np.zeros((2, D), np.float32).astype(BF16),
                    slots=np.array([0, 1], np.int32),
                    pool=np.zeros((4, 16, D), np.float32).astype(E4M3))
    for value, got in ((np.array("0.04"), "ndarray holding a str"),
                       (np.array(b"1"), "ndarray holding a bytes"),
                       (np.array(["0.5"], dtype=object), "ndarray holding a str"),
                       (np.array(True, dtype=object), "ndarray holding a bool"),
                       (np.array([False], dtype=object), "ndarray holding a bool"),
                       # NumPy's bool, which an object array keeps as it is (float() read 1.0)
                       (np.array([np.True_], dtype=object), "ndarray holding a bool"),
                       # NumPy times: a unitless timedelta's item() is an int (it was taken)
                       (np.timedelta64(2), "timedelta64 of timedelta64"),
                       (np.array([3], dtype="m8[s]"), "ndarray of timedelta64[s]"),
                       (np.datetime64(1, "D"), "datetime64 of datetime64[D]")):
        calls = {name: lambda name=name: smla.sparse_mla_decode(**bad(args, **{name: value}))
                 for name in ("bmm1_scale", "bmm2_scale")}
        calls["kv_scale"] = lambda: smla.quantize_kv(**quantize, kv_scale=value)
        calls["layers[0].bmm2_scale"] = lambda: smla.StepExecutor(
            [dataclasses.replace(layers[0], bmm2_scale=value)], max_tokens=8, max_columns=W)
        for name, call in calls.items():
            with pytest.raises(TypeError, match=f"^smla: {re.escape(name)}: expected a float, "
                               f"got {re.escape(got)}$") as info:
                call()
            assert info.value.argument == name


class _DlpackScalar:
    """A one-element array that exports only its DLPack device: (1, 0) CPU, (2, 0) CUDA,
    (3, 0) CUDA host (pinned) memory."""

    def __init__(self, device_type, value):
        self.device_type, self.value = device_type, value

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def item(self):
        return self.value


def test_scales_in_host_memory_are_read_device_ones_refused():
    """A scale in pinned host memory is read like a CPU one; one on a device would need a
    synchronisation, so it is refused before anything runs."""
    args, pools = make_case(ref.fresh_rng())
    expected_out, expected_lse = reference(args, pools)
    poison_unread(args, pools)
    smla.sparse_mla_decode(**bad(args, bmm1_scale=_DlpackScalar(3, args["bmm1_scale"]),
                                 bmm2_scale=_DlpackScalar(1, args["bmm2_scale"])))
    check(args, expected_out, expected_lse, args["query"].shape[1])
    for name in ("bmm1_scale", "bmm2_scale"):
        with pytest.raises(TypeError, match=f"smla: {name}: .*got a tensor on a device"):
            smla.sparse_mla_decode(**bad(args, **{name: _DlpackScalar(2, 0.5)}))


def test_dtype_errors_name_the_conversion_taken():
    """int64 indices and float64 arrays, which engines hold, are refused with the conversion."""
    args, _ = make_case(ref.fresh_rng())
    with pytest.raises(TypeError, match="got int64: indices, lengths and offsets are int32"):
        smla.sparse_mla_decode(**bad(args, seq_lens=args["seq_lens"].astype(np.int64)))
    with pytest.raises(TypeError, match=r"got float64: sinks and lse are float32 \(\.float\(\)"):
        smla.sparse_mla_decode(**bad(args, lse=args["lse"].astype(np.float64)))
    with pytest.raises(TypeError) as info:  # the error's parts, as attributes
        smla.sparse_mla_decode(**bad(args, sparse_indices=args["sparse_indices"].astype(np.int64)))
    assert info.value.argument == "sparse_indices"
    assert info.value.got.startswith("int64: indices, lengths and offsets are int32")
    assert "i32" in info.value.expected and "int64" not in info.value.expected


def test_an_array_dlpack_cannot_describe_names_its_dtype():
    args, _ = make_case(ref.fresh_rng())
    with pytest.raises(TypeError, match="smla: query: .*got ndarray of dtype >f4"):
        smla.sparse_mla_decode(**bad(args, query=args["query"].astype(">f4")))


def test_decode_of_no_tokens_is_checked_and_runs():
    """An idle engine step: T = 0 arrays (NumPy 2 may give empty arrays zero strides) pass the
    checks a non-empty step passes, and fail those it fails."""
    args, _ = make_case(ref.fresh_rng())
    empty = dict(args, query=args["query"][:0], sparse_indices=args["sparse_indices"][:0],
                 sparse_topk_lens=args["sparse_topk_lens"][:0], out=args["out"][:0],
                 lse=args["lse"][:0], seq_lens=args["seq_lens"][:0],
                 cum_seq_lens_q=np.zeros(1, np.int32), max_q_len=1)
    empty = {k: (np.empty(v.shape, v.dtype) if isinstance(v, np.ndarray) and v.size == 0 else v)
             for k, v in empty.items()}
    smla.sparse_mla_decode(**empty)
    heads = args["query"].shape[1]
    with pytest.raises(ValueError, match="smla: out:"):  # fewer heads than the query's
        smla.sparse_mla_decode(**dict(empty, out=np.empty((0, heads - 1, D), BF16)))


def read_only(x):
    view = x.view()
    view.flags.writeable = False
    return view


@pytest.mark.parametrize("output", ["out", "lse"])
def test_decode_read_only_output_is_refused(output):
    args, _ = make_case(ref.fresh_rng())
    with pytest.raises(TypeError, match=f"smla: {output}:") as info:
        smla.sparse_mla_decode(**dict(args, **{output: read_only(args[output])}))
    assert info.value.argument == output


def test_decode_refuses_a_stream_that_is_not_one_on_every_device():
    args, _ = make_case(ref.fresh_rng())
    for stream in ("abc", 1.5, object()):
        with pytest.raises(TypeError, match="smla: stream: expected an int cudaStream_t") as info:
            smla.sparse_mla_decode(**args, stream=stream)
        assert info.value.argument == "stream"


def test_stream_values_are_checked_on_every_device():
    """A bool, a handle past 64 bits or a negative one is refused by name on the CPU too, as a
    stream object whose handle is no int; NumPy ints are ints."""
    args, _ = make_case(ref.fresh_rng())
    smla.sparse_mla_decode(**args, stream=np.int64(0))

    class Odd:
        cuda_stream = "abc"

    class Flag:  # a bool is an int to operator.index, and no handle
        cuda_stream = True

    for stream, error, got in ((True, TypeError, "a bool"), (-1, ValueError, "-1"),
                               (2**70, ValueError, str(2**70)), (Odd(), TypeError, "'abc'"),
                               (Flag(), TypeError, "True")):
        with pytest.raises(error, match="smla: stream: expected .*, got " + re.escape(got)):
            smla.sparse_mla_decode(**args, stream=stream)


def test_arguments_of_the_wrong_kind_are_named():
    """What is not the kind of thing an argument takes raises TypeError naming it (ValueError for
    an int past its C++ type), not nanobind's or Python's own message."""
    flash = smla.model_preset("v4-flash")
    layer = smla.model_layers(flash, 1)[2]
    c = step_case(ref.fresh_rng())
    args, _ = make_case(ref.fresh_rng())
    cases = [
        (lambda: smla.model_preset(None), TypeError, "name"),
        (lambda: smla.model_layers(flash, 2.0), TypeError, "num_swa_groups"),
        (lambda: smla.model_layers(flash, 2, with_mtp=1), TypeError, "with_mtp"),
        (lambda: smla.model_layers("v4-flash", 2), TypeError, "preset"),
        (lambda: smla.model_layers(flash, 2**31), ValueError, "num_swa_groups"),
        (lambda: smla.topk_width(layer, 2**63), ValueError, "max_seq_len"),
        (lambda: smla.topk_width(None, 10), TypeError, "layer"),
        (lambda: smla.sparse_index_key(layer, "none"), TypeError, "sharing"),
        (lambda: smla.query_capability(512, None, "bf16", 64), TypeError, "query_dtype"),
        (lambda: smla.max_topk_width((1, 0)), TypeError, "device"),
        (lambda: smla.sparse_mla_decode(**dict(args, query=smla.with_dtype(args["query"], 16))),
         TypeError, "query"),
        (lambda: smla.sparse_mla_decode(**dict(args, sinks=smla.with_dtype(None, "f32"))),
         TypeError, "sinks"),
        (lambda: smla.sparse_mla_decode(**args, topk_columns={"topk_indices": c["topk"]}),
         TypeError, "topk_columns"),
        (lambda: smla.build_sparse_indices(None), TypeError, "args"),
        (lambda: smla.build_sparse_indices(smla.SparseIndexArgs(step=c["step"], swa=None)),
         TypeError, "swa"),
        (lambda: smla.build_sparse_indices(smla.SparseIndexArgs(step=None, swa=None)),
         TypeError, "swa"),
        (lambda: smla.SparseIndexTables(None), TypeError, "layers"),
        (lambda: smla.SparseIndexTables([layer, 3]), TypeError, "layers[1]"),
        (lambda: smla.StepExecutor([1, 2], 4, 640), TypeError, "layers[0]"),
        (lambda: smla.StepExecutor([smla.AttentionLayer(None, None, 0.04)], 4, 640),
         TypeError, "layers[0].spec"),
    ]
    for call, error, argument in cases:
        with pytest.raises(error, match=f"^smla: {re.escape(argument)}: expected ") as info:
            call()
        assert info.value.argument == argument
    # The kind named with its article (an AttentionLayer, a TopkColumns).
    with pytest.raises(TypeError, match=r"^smla: layers\[0\]: expected an AttentionLayer, "):
        smla.StepExecutor([1], 4, 640)
    with pytest.raises(TypeError, match="^smla: args: expected a SparseIndexArgs, "):
        smla.build_sparse_indices(None)


def test_index_builders_refuse_a_stream_that_is_not_one():
    """build_sparse_indices and SparseIndexTables check `stream` on the CPU too."""
    c = step_case(ref.fresh_rng())
    args = index_args(c, 4)
    args.out = smla.SparseIndexTable(np.zeros((4, W + 12), np.int32), np.zeros(4, np.int32))
    for stream in ("abc", 1.5, object()):
        with pytest.raises(TypeError, match="smla: stream: expected an int cudaStream_t") as info:
            smla.build_sparse_indices(args, stream=stream)
        assert info.value.argument == "stream"
        with pytest.raises(TypeError, match="smla: stream: expected an int cudaStream_t"):
            smla.SparseIndexTables(four_layers(4), "cpu", stream=stream)


def test_decode_too_many_heads_is_unsupported():
    rng = ref.fresh_rng()
    args, _ = make_case(rng, q_lens=(1,), seq_lens=(10,), heads=129, sinks=None)
    with pytest.raises(NotImplementedError, match="smla: query:") as info:
        smla.sparse_mla_decode(**args)
    assert info.value.argument == "query"


# ---------------------------------------------------------------------------------------------
# The engine-shaped call
# ---------------------------------------------------------------------------------------------

def test_engine_call_matches_the_op():
    """The op's output bit for bit, with a bmm2_scale of 0.5 and padded out heads (zeros)."""
    args, pools = make_case(ref.fresh_rng(), heads=5, out_heads=16, sinks="mixed")
    args["bmm2_scale"] = 0.5
    run_and_check(args, pools)
    expected = args["out"].copy()
    out = np.full_like(args["out"], np.nan)
    result = trtllm_batch_decode_sparse_mla_dsv4(
        query=args["query"], swa_kv_cache=args["swa_kv_cache"],
        compressed_kv_cache=args["compressed_kv_cache"], workspace_buffer=np.zeros(64, np.uint8),
        sparse_indices=args["sparse_indices"], sparse_topk_lens=args["sparse_topk_lens"],
        seq_lens=args["seq_lens"], out=out, bmm1_scale=np.float32(args["bmm1_scale"]),
        bmm2_scale=np.full(1, 0.5, np.float32), sinks=args["sinks"],  # a one-element host array
        cum_seq_lens_q=args["cum_seq_lens_q"],
        max_q_len=None, multi_ctas_kv_counter_buffer=None,
        sparse_indices_are_storage_offsets=True)
    assert result is out
    assert (out.view(np.uint16) == expected.view(np.uint16)).all()
    # The engine call checks `stream` as the op does (a CPU call takes None or 0).
    with pytest.raises(TypeError, match="smla: stream:") as info:
        trtllm_batch_decode_sparse_mla_dsv4(
            query=args["query"], swa_kv_cache=args["swa_kv_cache"],
            compressed_kv_cache=args["compressed_kv_cache"],
            sparse_indices=args["sparse_indices"], sparse_topk_lens=args["sparse_topk_lens"],
            seq_lens=args["seq_lens"], out=out, bmm1_scale=args["bmm1_scale"],
            cum_seq_lens_q=args["cum_seq_lens_q"], stream="abc")
    assert info.value.argument == "stream"


def test_engine_call_forwards_lse_and_window():
    """`lse` and `window` reach the op: the engine call writes the op's lse and, with another
    window, the op's output for it; window=0 is the op's error."""
    args, _ = make_case(ref.fresh_rng())
    common = {k: args[k] for k in ("query", "swa_kv_cache", "compressed_kv_cache",
                                   "sparse_indices", "sparse_topk_lens", "seq_lens",
                                   "cum_seq_lens_q", "max_q_len", "sinks", "bmm1_scale")}
    outs = []
    for window in (W, 64):
        want = dict(args, window=window, out=np.full_like(args["out"], np.nan),
                    lse=np.full_like(args["lse"], np.nan))
        smla.sparse_mla_decode(**want)
        assert np.isfinite(want["out"].astype(np.float32)).all()
        out, lse = np.full_like(args["out"], np.nan), np.full_like(args["lse"], np.nan)
        trtllm_batch_decode_sparse_mla_dsv4(**common, out=out, lse=lse, window=window)
        assert np.isfinite(lse).all()
        assert (out.view(np.uint16) == want["out"].view(np.uint16)).all(), window
        assert (lse.view(np.uint32) == want["lse"].view(np.uint32)).all(), window
        outs.append(out)
    assert (outs[0].view(np.uint16) != outs[1].view(np.uint16)).any()  # the window matters
    with pytest.raises(ValueError, match="smla: window:") as info:
        trtllm_batch_decode_sparse_mla_dsv4(**common, out=out, window=0)
    assert info.value.argument == "window"


def test_engine_call_allocates_nothing_for_sizes_the_op_refuses():
    """The engine call makes its out and a 4-D query's offsets, and reads max_q_len from host
    offsets, only for sizes the op takes (T < 2^31 tokens, H <= 128 heads, B + 1 offsets for the
    B of seq_lens): a broadcast view (stride 0, no memory behind it) of 2^40 tokens, requests or
    offsets had NumPy allocate TiBs (a MemoryError) before the op refused it (a fuzzer's
    finding). The op's error names it now; offsets of a size it takes are read a chunk at a
    time, not diffed whole into a copy of their size."""
    args, _ = make_case(ref.fresh_rng())
    common = {k: args[k] for k in ("query", "swa_kv_cache", "compressed_kv_cache",
                                   "sparse_indices", "sparse_topk_lens", "seq_lens",
                                   "cum_seq_lens_q", "sinks", "bmm1_scale", "out")}

    def broadcast(a, *sizes):  # a's rows, repeated: new leading dims of stride 0
        return np.lib.stride_tricks.as_strided(a, sizes + a.shape[1:],
                                               (0,) * len(sizes) + a.strides[1:])

    tokens, requests = broadcast(args["query"], 2**40), broadcast(args["query"], 2**40, 2)
    raises_named(NotImplementedError, "query", lambda: trtllm_batch_decode_sparse_mla_dsv4(
        **dict(common, query=tokens, out=None)))
    raises_named(NotImplementedError, "query", lambda: trtllm_batch_decode_sparse_mla_dsv4(
        **dict(common, query=requests, cum_seq_lens_q=None,
               seq_lens=broadcast(args["seq_lens"], 2**40))))
    zeros = np.zeros(1, np.int32)
    raises_named(ValueError, "cum_seq_lens_q", lambda: trtllm_batch_decode_sparse_mla_dsv4(
        **dict(common, max_q_len=None, cum_seq_lens_q=broadcast(zeros, 2**40))))
    # 2^23 requests of no tokens (a T = 0 step): B + 1 offsets (32 MiB) that the op takes, read
    # without a diff of their size.
    b = 2**23
    empty = {k: common[k][:0] for k in ("query", "sparse_indices", "sparse_topk_lens", "out")}
    seq_lens, cum = np.zeros(b, np.int32), np.zeros(b + 1, np.int32)
    tracemalloc.start()
    try:
        trtllm_batch_decode_sparse_mla_dsv4(**dict(common, **empty, sinks=None, max_q_len=None,
                                                   seq_lens=seq_lens, cum_seq_lens_q=cum))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < cum.nbytes // 4, f"{peak} bytes to read {cum.nbytes} of offsets"


def test_engine_call_refuses_what_is_not_an_array():
    args, _ = make_case(ref.fresh_rng())
    for out in (None, args["out"]):  # the output allocated from the query's shape, or given
        with pytest.raises(TypeError, match="smla: query: expected an array") as info:
            trtllm_batch_decode_sparse_mla_dsv4(
                query=args["query"].astype(np.float32).tolist(),
                swa_kv_cache=args["swa_kv_cache"], compressed_kv_cache=args["compressed_kv_cache"],
                sparse_indices=args["sparse_indices"], sparse_topk_lens=args["sparse_topk_lens"],
                seq_lens=args["seq_lens"], out=out, bmm1_scale=args["bmm1_scale"],
                cum_seq_lens_q=args["cum_seq_lens_q"], max_q_len=args["max_q_len"])
        assert info.value.argument == "query"


def test_engine_call_allocates_out_only_like_a_query_with_a_shape():
    """out=None makes an output like the query: a DLPack producer that states no shape (a bare
    capsule, an exporter of no framework) leaves nothing to make it like, so it is refused by a
    ValueError naming out; an AttributeError had escaped (a fuzzer's finding). Given an out,
    such a query runs: a capsule too, which the call had read once to check it was an array,
    so that the op found it used ("expected an array ..., got PyCapsule")."""
    args, _ = make_case(ref.fresh_rng())
    common = {k: args[k] for k in ("swa_kv_cache", "compressed_kv_cache", "sparse_indices",
                                   "sparse_topk_lens", "seq_lens", "cum_seq_lens_q", "max_q_len",
                                   "sinks", "bmm1_scale")}
    want = trtllm_batch_decode_sparse_mla_dsv4(**common, query=args["query"])
    assert np.isfinite(want.astype(np.float32)).all()
    bits = args["query"].view(np.uint16)
    for exported in (lambda: DlpackExport(bits, CPU, BFLOAT),
                     lambda: smla.with_dtype(bits.__dlpack__(), "bf16")):
        with pytest.raises(ValueError, match="^smla: out: expected an array") as info:
            trtllm_batch_decode_sparse_mla_dsv4(**common, query=exported(), out=None)
        assert info.value.argument == "out"
        out = np.full_like(args["out"], np.nan)
        assert trtllm_batch_decode_sparse_mla_dsv4(**common, query=exported(), out=out) is out
        assert (out.view(np.uint16) == want.view(np.uint16)).all()


def test_engine_call_reads_max_q_len_from_dlpack_offsets():
    """max_q_len=None reads a host cum_seq_lens_q that only exports DLPack (np.from_dlpack); it
    had been taken for no offsets, so max_q_len 1 was passed and the op refused the valid call
    naming max_q_len (a fuzzer's finding). A bare capsule, which can be read once only (by the
    op), needs max_q_len given, as device offsets do; what NumPy cannot read is left to the op's
    named error (NumPy's own ValueError had escaped)."""
    args, _ = make_case(ref.fresh_rng())  # q_lens 1, 3, 2
    common = {k: args[k] for k in ("query", "swa_kv_cache", "compressed_kv_cache",
                                   "sparse_indices", "sparse_topk_lens", "seq_lens", "sinks",
                                   "bmm1_scale")}
    want = trtllm_batch_decode_sparse_mla_dsv4(**common, cum_seq_lens_q=args["cum_seq_lens_q"])
    assert np.isfinite(want.astype(np.float32)).all()
    got = trtllm_batch_decode_sparse_mla_dsv4(
        **common, cum_seq_lens_q=DlpackExport(args["cum_seq_lens_q"], CPU, INT))
    assert (got.view(np.uint16) == want.view(np.uint16)).all()
    with pytest.raises(ValueError, match="^smla: max_q_len: expected an int .*capsule") as info:
        trtllm_batch_decode_sparse_mla_dsv4(**common,
                                            cum_seq_lens_q=args["cum_seq_lens_q"].__dlpack__())
    assert (info.value.argument, info.value.got) == ("max_q_len", "None")
    got = trtllm_batch_decode_sparse_mla_dsv4(
        **common, cum_seq_lens_q=args["cum_seq_lens_q"].__dlpack__(), max_q_len=3)
    assert (got.view(np.uint16) == want.view(np.uint16)).all()

    class BrokenInterface:  # NumPy's asarray raises its own ValueError for it
        __array_interface__ = {}

    raises_named(TypeError, "cum_seq_lens_q", lambda: trtllm_batch_decode_sparse_mla_dsv4(
        **common, cum_seq_lens_q=BrokenInterface()))


def test_engine_call_dspark_shapes_and_allocated_out():
    """[T, 1, H, D] query and out, [T, 1, K] indices, one request per token (DSpark)."""
    args, pools = make_case(ref.fresh_rng(), q_lens=(1, 1, 1),
                            seq_lens=(3, 200, 129))
    args["cum_seq_lens_q"] = None
    args["max_q_len"] = 1
    expected_out, _ = reference(args, pools)
    poison_unread(args, pools)
    num_tokens = args["query"].shape[0]
    out = trtllm_decode_sparse_mla_dsv4(
        query=args["query"][:, None], swa_kv_cache=args["swa_kv_cache"],
        compressed_kv_cache=args["compressed_kv_cache"], workspace_buffer=None,
        sparse_indices=args["sparse_indices"][:, None], sparse_topk_lens=args["sparse_topk_lens"],
        seq_lens=args["seq_lens"], out=None, bmm1_scale=args["bmm1_scale"], bmm2_scale=1.0,
        sinks=args["sinks"], cum_seq_lens_q=None, max_q_len=1, kv_counters=None)
    assert out.shape == (num_tokens, 1, 8, D)
    ref.assert_out_close(out[:, 0], expected_out, ref.CPU_TOL)
    # kv_counters is the op's multi-CTA counters: checked (u8) on the CPU too.
    with pytest.raises(TypeError, match="smla: kv_counters:") as info:
        trtllm_decode_sparse_mla_dsv4(
            query=args["query"][:, None], swa_kv_cache=args["swa_kv_cache"],
            compressed_kv_cache=args["compressed_kv_cache"],
            sparse_indices=args["sparse_indices"][:, None],
            sparse_topk_lens=args["sparse_topk_lens"], seq_lens=args["seq_lens"],
            bmm1_scale=args["bmm1_scale"], kv_counters=np.zeros(64, np.float32))
    assert info.value.argument == "kv_counters"
    # NumPy's bf16 comes from ml_dtypes, an optional dependency: without it, out=None is refused
    # by name.
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "ml_dtypes", None)  # `import ml_dtypes` raises ImportError
        with pytest.raises(ImportError, match="smla: out:") as info:
            trtllm_decode_sparse_mla_dsv4(
                query=args["query"], swa_kv_cache=args["swa_kv_cache"],
                compressed_kv_cache=args["compressed_kv_cache"],
                sparse_indices=args["sparse_indices"],
                sparse_topk_lens=args["sparse_topk_lens"], seq_lens=args["seq_lens"],
                bmm1_scale=args["bmm1_scale"], cum_seq_lens_q=args["cum_seq_lens_q"],
                max_q_len=args["max_q_len"])
    assert info.value.argument == "out"
    assert isinstance(info.value.__cause__, ImportError)  # the wrapper's rename keeps its cause


def test_engine_call_uniform_q_len_from_4d_query():
    """[B, q, H, D] with B = 2 requests of q = 3 tokens (B != q: the offsets count q)."""
    args, pools = make_case(ref.fresh_rng(), q_lens=(3, 3), seq_lens=(3, 260))
    expected_out, _ = reference(args, pools)
    query = args["query"].reshape(2, 3, 8, D)
    out = np.full((2, 3, 8, D), np.nan, np.float32).astype(BF16)
    trtllm_batch_decode_sparse_mla_dsv4(
        query=query, swa_kv_cache=args["swa_kv_cache"],
        compressed_kv_cache=args["compressed_kv_cache"], sparse_indices=args["sparse_indices"],
        sparse_topk_lens=args["sparse_topk_lens"], seq_lens=args["seq_lens"], out=out,
        bmm1_scale=args["bmm1_scale"], sinks=args["sinks"])
    ref.assert_out_close(out.reshape(6, 8, D), expected_out, ref.CPU_TOL)


def test_engine_call_4d_query_checks_seq_lens_against_its_b():
    """A [B, q, H, D] query without cum_seq_lens_q makes B requests' offsets from seq_lens:
    seq_lens that is no array, or of no B, is named as the 3-D call names it (not an
    AttributeError or IndexError, nor the cum_seq_lens_q the caller never passed)."""
    args, _ = make_case(ref.fresh_rng(), q_lens=(2, 2), seq_lens=(2, 260))
    query = args["query"].reshape(2, 2, 8, D)
    common = dict(swa_kv_cache=args["swa_kv_cache"],
                  compressed_kv_cache=args["compressed_kv_cache"],
                  sparse_indices=args["sparse_indices"], sparse_topk_lens=args["sparse_topk_lens"],
                  bmm1_scale=args["bmm1_scale"])
    for seq_lens, error in (([2, 260], TypeError), (np.int32(260), ValueError)):
        with pytest.raises(error) as flat:  # the 3-D call's error ...
            trtllm_batch_decode_sparse_mla_dsv4(query=args["query"], seq_lens=seq_lens,
                                                cum_seq_lens_q=args["cum_seq_lens_q"], **common)
        with pytest.raises(error) as info:  # ... is the 4-D one's
            trtllm_batch_decode_sparse_mla_dsv4(query=query, seq_lens=seq_lens, **common)
        assert info.value.argument == "seq_lens"
        assert str(info.value) == str(flat.value)
    # [2, 1] has the B in its first dim: it is refused by its dims, not taken for [B].
    for seq_lens in (args["seq_lens"][:1], np.array([[2, 260]], np.int32),
                     np.array([[2], [260]], np.int32)):
        with pytest.raises(ValueError) as info:
            trtllm_batch_decode_sparse_mla_dsv4(query=query, seq_lens=seq_lens, **common)
        assert str(info.value) == (
            "smla: seq_lens: expected [B = 2] (the B of query [2, 2, 8, 512], cum_seq_lens_q "
            f"absent), got [{', '.join(map(str, seq_lens.shape))}]")


def test_engine_call_errors_give_the_shape_passed_before_the_merge():
    """An error about a [B, q, ...] array the call merged into [B*q, ...] says the shape the
    caller passed, and the merged one it was checked as."""
    args, _ = make_case(ref.fresh_rng(), q_lens=(2, 2), seq_lens=(2, 260))
    common = dict(swa_kv_cache=args["swa_kv_cache"],
                  compressed_kv_cache=args["compressed_kv_cache"],
                  sparse_topk_lens=args["sparse_topk_lens"], bmm1_scale=args["bmm1_scale"],
                  seq_lens=args["seq_lens"], cum_seq_lens_q=args["cum_seq_lens_q"])
    query, indices = args["query"], args["sparse_indices"]
    with pytest.raises(ValueError) as info:
        trtllm_batch_decode_sparse_mla_dsv4(query=query, **common,
                                            sparse_indices=np.full((2, 2, 64), -1, np.int32))
    assert info.value.argument == "sparse_indices"
    assert info.value.got == "[2, 2, 64] (its first two dims merged: [4, 64])"
    with pytest.raises(ValueError) as info:  # 7 heads: the out's [B, q, H_out, D] too
        trtllm_batch_decode_sparse_mla_dsv4(query=query.reshape(2, 2, 8, D), **common,
                                            sparse_indices=indices,
                                            out=np.zeros((2, 2, 7, D), BF16))
    assert (info.value.argument, info.value.got) == (
        "out", "[2, 2, 7, 512] (its first two dims merged: [4, 7, 512])")
    with pytest.raises(ValueError) as info:  # a 3-D array is as it came
        trtllm_batch_decode_sparse_mla_dsv4(query=query, **common,
                                            sparse_indices=indices[:, :64])
    assert info.value.got == "[4, 64]"


def test_engine_call_takes_with_dtype_arrays():
    """A with_dtype query in [B, q, H, D], out allocated: the op's result."""
    args, pools = make_case(ref.fresh_rng(), q_lens=(2, 2), seq_lens=(2, 260))
    expected_out, _ = reference(args, pools)
    query = smla.with_dtype(args["query"].reshape(2, 2, 8, D).view(np.uint16), "bf16")
    out = trtllm_batch_decode_sparse_mla_dsv4(
        query=query, swa_kv_cache=args["swa_kv_cache"],
        compressed_kv_cache=args["compressed_kv_cache"], sparse_indices=args["sparse_indices"],
        sparse_topk_lens=args["sparse_topk_lens"], seq_lens=args["seq_lens"],
        bmm1_scale=args["bmm1_scale"], sinks=args["sinks"])
    assert out.shape == (2, 2, 8, D)
    ref.assert_out_close(out.reshape(4, 8, D), expected_out, ref.CPU_TOL)


def test_engine_call_takes_with_dtype_offsets_and_lengths():
    """with_dtype cum_seq_lens_q (max_q_len derived) and seq_lens (4-D query's offsets)."""
    args, pools = make_case(ref.fresh_rng(), q_lens=(2, 2), seq_lens=(2, 260))
    expected_out, _ = reference(args, pools)
    common = dict(swa_kv_cache=args["swa_kv_cache"],
                  compressed_kv_cache=args["compressed_kv_cache"],
                  sparse_indices=args["sparse_indices"], sparse_topk_lens=args["sparse_topk_lens"],
                  bmm1_scale=args["bmm1_scale"], sinks=args["sinks"],
                  sparse_indices_are_storage_offsets=np.True_)
    out = trtllm_batch_decode_sparse_mla_dsv4(
        query=args["query"], seq_lens=args["seq_lens"],
        cum_seq_lens_q=smla.with_dtype(args["cum_seq_lens_q"], "i32"), **common)
    ref.assert_out_close(out, expected_out, ref.CPU_TOL)
    out = trtllm_batch_decode_sparse_mla_dsv4(
        query=args["query"].reshape(2, 2, 8, D),
        seq_lens=smla.with_dtype(args["seq_lens"], "i32"), **common)
    ref.assert_out_close(out.reshape(4, 8, D), expected_out, ref.CPU_TOL)


def test_engine_call_refuses_slots_and_copies():
    args, _ = make_case(ref.fresh_rng())
    common = dict(query=args["query"], swa_kv_cache=args["swa_kv_cache"],
                  sparse_indices=args["sparse_indices"],
                  sparse_topk_lens=args["sparse_topk_lens"], seq_lens=args["seq_lens"],
                  cum_seq_lens_q=args["cum_seq_lens_q"], max_q_len=3, out=args["out"],
                  bmm1_scale=0.04)
    # True or NumPy's True only: a truthy int, string or array is no promise of offsets.
    for flag in (False, 1, "yes", np.array([True])):
        with pytest.raises(ValueError, match="sparse_indices_are_storage_offsets") as info:
            trtllm_batch_decode_sparse_mla_dsv4(**common, sparse_indices_are_storage_offsets=flag)
        assert info.value.argument == "sparse_indices_are_storage_offsets"
    split = np.zeros((3, 3, 8, D), BF16)[:, :2]  # [B, q, H, D] whose tokens do not merge
    with pytest.raises(ValueError, match=r"smla: out: .*strides \(\d+, \d+, \d+, 2\) \(bytes\)"):
        trtllm_batch_decode_sparse_mla_dsv4(**dict(common, out=split))
    # max_q_len computed from offsets that are no [B+1] array: the offsets' error, named.
    for cum in (np.array(3, np.int32), np.int32(3)):
        with pytest.raises(ValueError, match="smla: cum_seq_lens_q:") as info:
            trtllm_batch_decode_sparse_mla_dsv4(**dict(common, cum_seq_lens_q=cum,
                                                       max_q_len=None))
        assert info.value.argument == "cum_seq_lens_q"


# ---------------------------------------------------------------------------------------------
# Buffers, capability
# ---------------------------------------------------------------------------------------------

def test_buffer_sizes_and_capability():
    assert smla.workspace_bytes(64, 64, 640, "cpu") == 0
    assert (smla.kv_counter_bytes(64, 64) > 0) == smla.WITH_CUDA
    if not smla.WITH_CUDA:
        assert smla.kv_counter_bytes(64, 64) == 0
        assert "cuda: not built" in smla.backend_info()
    assert smla.query_capability(512, "bf16", "bf16", 64, "cpu") == (True, "")
    supported, reason = smla.query_capability(576, "bf16", "bf16", 64, "cpu")
    assert not supported and "512" in reason
    with pytest.raises(ValueError, match="smla: kv_dtype:"):
        smla.query_capability(512, "bf16", "fp16", 64, "cpu")
    # The command's layout names (--kv) are answered with the pool dtype they take.
    for layout, dtype in (("fp8_ds_mla", "u8"), ("fp8_e4m3", "f8e4m3")):
        with pytest.raises(ValueError, match=f"got {layout} \\(an {layout} pool is {dtype}\\)$"):
            smla.query_capability(512, "bf16", layout, 64, "cpu")
    with pytest.raises(TypeError, match="smla: head_size: expected an int, got a bool"):
        smla.query_capability(True, "bf16", "bf16", 64, "cpu")
    with pytest.raises(TypeError, match="smla: block_size: expected an int, got float"):
        smla.query_capability(512, "bf16", "bf16", 64.0, "cpu")
    # A device's index is an int32 in its text too: named errors, not int()'s or nanobind's.
    # A kind that is not cpu or cuda is a bad form (TypeError), a negative index a bad value.
    for device, error in [("cuda:x", TypeError), ("cuda:1.5", TypeError),
                          ("cuda:99999999999", ValueError), (("cuda", 2**40), ValueError),
                          (("cuda", "0"), TypeError), ("tpu", TypeError), ("tpu:0", TypeError),
                          ("cuda:-1", ValueError), (("cuda", -1), ValueError),
                          ("cuda: 1", TypeError), ("cuda:1_0", TypeError), ("cuda:+1", TypeError),
                          ("cuda:1 ", TypeError)]:  # int() would take these: digits only
        with pytest.raises(error, match="smla: device:") as info:
            smla.workspace_bytes(64, 64, 640, device)
        assert info.value.argument == "device"
    # Sizes reach the library in their order: num_heads alone is bounded (1..128).
    assert smla.workspace_bytes(200, 8, 640, "cpu") == 0
    smla.kv_counter_bytes(200, 8)
    for size in (lambda: smla.kv_counter_bytes(8, 200),
                 lambda: smla.workspace_bytes(8, 200, 640, "cpu")):
        with pytest.raises(NotImplementedError, match="smla: num_heads: expected 1..128, got 200"):
            size()
    with pytest.raises(ValueError, match="smla: num_heads: expected 1..128, got 0"):
        smla.kv_counter_bytes(8, 0)


# ---------------------------------------------------------------------------------------------
# Index builders, tables, executor
# ---------------------------------------------------------------------------------------------

def step_case(rng, q_lens=(1, 2, 1), seq_lens=(5, 200, 131), top_k=12, invalid=None, min_topk=0):
    """One decode step's metadata, an SWA group and compressed columns (ratio 4): each token
    has min_topk..top_k top-k entries, as many as it can see."""
    num_tokens = sum(q_lens)
    cum = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    swa_view, swa = bf16_pool(rng, 40, 64, 80)        # packed: span 80
    comp_view, comp = bf16_pool(rng, 30, 16, 20)      # E = 16 entries a page, span 20
    block_table = rng.permutation(40)[:16].reshape(4, 4).astype(np.int32)  # B <= 4, 4 pages
    block_table[1, 0] = -1  # an evicted page before request 1's window
    comp_table = rng.permutation(30)[:16].reshape(4, 4).astype(np.int32)
    topk = np.full((num_tokens, top_k), -1, np.int32)
    pos = ref.positions(np.array(seq_lens), cum, num_tokens)
    for t in range(num_tokens):
        visible = (pos[t] + 1) // 4
        n = min(visible, int(rng.integers(min_topk, top_k + 1)))
        topk[t, :n] = rng.choice(max(visible, 1), n, replace=False)
    valid = None
    if invalid is not None:
        valid = np.ones(num_tokens, np.uint8)
        valid[invalid] = 0
    step = smla.StepMetadata(num_tokens=num_tokens, seq_lens=np.array(seq_lens, np.int32),
                             cum_seq_lens_q=cum, is_valid_token=valid,
                             num_decodes=len(q_lens), max_q_len=max(q_lens))
    return dict(step=step, swa_view=swa_view, swa=swa, comp_view=comp_view, comp=comp,
                block_table=block_table, comp_table=comp_table, topk=topk)


def expected_table(c, ratio, window=W):
    s = c["step"]
    return ref.decode_table(s.seq_lens, s.cum_seq_lens_q, s.num_tokens, c["block_table"], 64, 80,
                            window, ratio, c["topk"], c["comp_table"], 16, 20, s.is_valid_token)


def index_args(c, ratio):
    compressed = smla.CompressedColumns()
    if ratio:
        compressed = smla.CompressedColumns(ratio, c["topk"], c["comp_table"], c["comp_view"])
    return smla.SparseIndexArgs(step=c["step"], swa=smla.SwaGroup(c["block_table"], c["swa_view"]),
                                compressed=compressed)


@pytest.mark.parametrize("ratio", [0, 4])
def test_build_sparse_indices(ratio):
    c = step_case(ref.fresh_rng(), invalid=[2])
    args = index_args(c, ratio)
    k = smla.sparse_index_columns(W, c["topk"].shape[1] if ratio else 0)
    assert k == W + (12 if ratio else 0)
    args.out = smla.SparseIndexTable(np.full((4, k), 12345, np.int32), np.full(4, -9, np.int32))
    smla.build_sparse_indices(args)
    indices, lens = expected_table(c, ratio)
    np.testing.assert_array_equal(args.out.sparse_indices, indices)
    np.testing.assert_array_equal(args.out.sparse_topk_lens, lens)


@pytest.mark.parametrize("ratio", [0, 4])
def test_build_sparse_indices_window_other_than_128(ratio):
    c = step_case(ref.fresh_rng(), invalid=[2])
    args = index_args(c, ratio)
    args.window = 64
    k = smla.sparse_index_columns(64, c["topk"].shape[1] if ratio else 0)
    args.out = smla.SparseIndexTable(np.full((4, k), 12345, np.int32), np.full(4, -9, np.int32))
    smla.build_sparse_indices(args)
    indices, lens = expected_table(c, ratio, window=64)
    np.testing.assert_array_equal(args.out.sparse_indices, indices)
    np.testing.assert_array_equal(args.out.sparse_topk_lens, lens)


def test_build_sparse_indices_dspark():
    """DSpark (decode_swa_width past W): K is the width, every token of a draft block gets the
    block's window and its request's seq_len; SparseIndexTables gives the same table, with
    those seq_lens."""
    c = step_case(ref.fresh_rng(), q_lens=(1, 3, 2), seq_lens=(5, 200, 131))
    s = c["step"]
    width = smla.dspark_swa_width(W, 3)
    s.decode_swa_width = width
    k = smla.sparse_index_columns(W, 0, width)
    assert k == width
    # A width the build refuses is refused where buffers are sized: not a multiple of 4, or
    # with top-k columns (the DSpark window is for SWA-only layers).
    with pytest.raises(ValueError, match="^smla: decode_swa_width: expected a multiple of 4"):
        smla.sparse_index_columns(W, 0, W + 1)
    with pytest.raises(ValueError, match="^smla: top_k: expected 0 .*SWA-only.*, got 512$"):
        smla.sparse_index_columns(W, 512, width)
    swa = smla.SwaGroup(c["block_table"], c["swa_view"])
    out = smla.SparseIndexTable(np.full((6, k), 12345, np.int32), np.full(6, -9, np.int32),
                                np.full(6, -9, np.int32))
    smla.build_sparse_indices(smla.SparseIndexArgs(step=s, swa=swa, out=out))
    indices, lens, seq_lens = ref.dspark_table(s.seq_lens, s.cum_seq_lens_q, 6, c["block_table"],
                                               64, 80, W, k)
    np.testing.assert_array_equal(out.seq_lens, np.repeat(s.seq_lens, (1, 3, 2)))
    np.testing.assert_array_equal(out.seq_lens, seq_lens)
    np.testing.assert_array_equal(out.sparse_indices, indices)
    np.testing.assert_array_equal(out.sparse_topk_lens, lens)
    assert (out.sparse_topk_lens > W).any()  # a draft block's window past W
    tables = smla.SparseIndexTables([smla.LayerSpec(layer=0, num_heads=4)], "cpu")
    table = tables.lookup(0, lambda layer: smla.SparseIndexArgs(step=s, swa=swa))
    np.testing.assert_array_equal(table.sparse_indices, indices)
    np.testing.assert_array_equal(table.sparse_topk_lens, lens)
    np.testing.assert_array_equal(table.seq_lens, seq_lens)
    with pytest.raises(ValueError):  # read-only, as the table's other arrays
        table.seq_lens[0] = 0


def test_decode_reads_the_topk_as_its_table_would():
    rng = ref.fresh_rng()
    c = step_case(rng, invalid=[1], min_topk=2)  # tokens 2 and 3 keep an entry before the -1
    for row in c["topk"]:  # decode rows: -1 from some entry on (valid ones first, SPEC §4)
        row[rng.integers(1, row.size):] = -1
    full, swa = index_args(c, 4), index_args(c, 0)
    full.out = smla.SparseIndexTable(np.zeros((4, W + 12), np.int32), np.zeros(4, np.int32))
    swa.out = smla.SparseIndexTable(np.zeros((4, W), np.int32), np.zeros(4, np.int32))
    smla.build_sparse_indices(full)
    smla.build_sparse_indices(swa)
    assert (full.out.sparse_topk_lens > W).any()  # compressed columns to compare
    s = c["step"]
    query = rng.standard_normal((4, 4, D)).astype(BF16)
    common = dict(query=query, swa_kv_cache=c["swa_view"], compressed_kv_cache=c["comp_view"],
                  seq_lens=s.seq_lens, cum_seq_lens_q=s.cum_seq_lens_q, max_q_len=s.max_q_len,
                  bmm1_scale=D**-0.5)
    outs = [np.full((4, 4, D), np.nan, np.float32).astype(BF16) for _ in range(2)]
    smla.sparse_mla_decode(**common, sparse_indices=full.out.sparse_indices,
                           sparse_topk_lens=full.out.sparse_topk_lens, out=outs[0])
    topk = smla.TopkColumns(c["topk"], c["comp_table"], compress_ratio=4,
                            num_decodes=s.num_decodes, is_valid_token=s.is_valid_token)
    smla.sparse_mla_decode(**common, sparse_indices=swa.out.sparse_indices,
                           sparse_topk_lens=None, out=outs[1], topk_columns=topk)
    assert np.isfinite(outs[0].astype(np.float32)).all()
    assert (outs[0].view(np.uint16) == outs[1].view(np.uint16)).all()
    topk.compress_ratio = 0
    with pytest.raises(ValueError, match="smla: topk_columns.compress_ratio:"):
        smla.sparse_mla_decode(**common, sparse_indices=swa.out.sparse_indices,
                               sparse_topk_lens=None, out=outs[1], topk_columns=topk)
    # Its other fields without the top-k: the call would read the table alone.
    topk = smla.TopkColumns(None, c["comp_table"], compress_ratio=4)
    with pytest.raises(ValueError, match="smla: topk_columns.topk_indices: expected .* as "
                       "topk_columns.block_table is given, got absent"):
        smla.sparse_mla_decode(**common, sparse_indices=swa.out.sparse_indices,
                               sparse_topk_lens=swa.out.sparse_topk_lens, out=outs[1],
                               topk_columns=topk)
    # A valid entry after a negative one would lie past the row's length: refused by both.
    c["topk"][3, :2] = [-1, 0]
    with pytest.raises(ValueError, match=r"smla: topk_indices: .* the valid ones \(>= 0\) first"):
        smla.build_sparse_indices(full)
    with pytest.raises(ValueError, match=r"smla: topk_columns.topk_indices: .*\[3\]\[1\] = 0"):
        smla.sparse_mla_decode(**common, sparse_indices=swa.out.sparse_indices,
                               sparse_topk_lens=None, out=outs[1],
                               topk_columns=smla.TopkColumns(c["topk"], c["comp_table"],
                                                             compress_ratio=4,
                                                             num_decodes=s.num_decodes))
    assert smla.max_topk_width("cpu") == 2**63 - 1
    assert smla.max_topk_width("cuda") == (2048 if smla.WITH_CUDA else 0)


def test_build_sparse_indices_errors_name_the_argument():
    c = step_case(ref.fresh_rng())
    args = index_args(c, 4)
    args.out = smla.SparseIndexTable(np.zeros((4, W + 12), np.int32), np.zeros(4, np.int32))
    args.swa.block_table = c["block_table"].astype(np.int64)
    with pytest.raises(TypeError, match="smla: block_table: .*, got int64: indices, lengths and "
                       r"offsets are int32 \(\.to\(torch\.int32\)"):
        smla.build_sparse_indices(args)
    args.swa.block_table = c["block_table"].astype(np.uint16)  # i32 alone: no bf16 bits
    with pytest.raises(TypeError, match="smla: block_table: expected i32 elements, got uint16: "
                       "indices, lengths and offsets are int32"):
        smla.build_sparse_indices(args)
    args.swa.block_table = c["block_table"]
    args.out.sparse_indices = np.zeros((4, W + 4), np.int32)
    with pytest.raises(ValueError, match="smla: sparse_indices:"):
        smla.build_sparse_indices(args)
    assert smla.dspark_swa_width(W, 3) == 192


def test_build_sparse_indices_checks_max_q_len():
    """StepMetadata.max_q_len is checked by the builder as the decode checks it (>= 1, and no
    request of more tokens, a host value), naming max_q_len; a larger one builds the same
    table."""
    c = step_case(ref.fresh_rng(), q_lens=(1, 3, 2))
    args = index_args(c, 4)
    k = smla.sparse_index_columns(W, c["topk"].shape[1])
    args.out = smla.SparseIndexTable(np.full((6, k), 12345, np.int32), np.full(6, -9, np.int32))
    smla.build_sparse_indices(args)
    want = args.out.sparse_indices.copy(), args.out.sparse_topk_lens.copy()
    for max_q_len, expected in ((0, ">= 1"), (-5, ">= 1"),
                                (2, ">= every q_len (request 1 has q_len 3)")):
        args.step = dataclasses.replace(c["step"], max_q_len=max_q_len)
        with pytest.raises(ValueError) as info:
            smla.build_sparse_indices(args)
        assert str(info.value) == f"smla: max_q_len: expected {expected}, got {max_q_len}"
    args.step = dataclasses.replace(c["step"], max_q_len=8)
    smla.build_sparse_indices(args)
    np.testing.assert_array_equal(args.out.sparse_indices, want[0])
    np.testing.assert_array_equal(args.out.sparse_topk_lens, want[1])


def layers_and_pools(rng, heads=4):
    """Four layers, two SWA groups: SWA-only in each, then a run of one ratio-4 key
    (index and kv source: layer 2) across both groups."""
    specs = four_layers(heads)
    return specs, [bf16_pool(rng, 40, 64, 80) for _ in specs]


def test_sparse_index_tables_share_and_fork():
    rng = ref.fresh_rng()
    c = step_case(rng)
    specs, _ = layers_and_pools(rng)
    assert [smla.sparse_index_key(s) for s in specs] == ["swa_only", "swa_only", "2:2:4", "2:2:4"]
    none = [smla.sparse_index_key(s, smla.TableSharing.none) for s in specs]
    assert len(set(none)) == 4, none  # without sharing, a key per layer
    other_table = rng.permutation(40)[:16].reshape(4, 4).astype(np.int32)
    groups = [c["block_table"], other_table]

    def inputs(layer):
        args = index_args(dict(c, block_table=groups[specs[layer].swa_group]),
                          specs[layer].compress_ratio)
        return args

    tables = smla.SparseIndexTables(specs, "cpu")
    for step in range(2):  # a second step after reset, on other pages, gets its own tables
        if step:
            groups = [rng.permutation(40)[:16].reshape(4, 4).astype(np.int32) for _ in groups]
        tables.reset()
        for spec in specs:
            table = tables.lookup(spec.layer, inputs)
            indices, lens = expected_table(dict(c, block_table=groups[spec.swa_group]),
                                           spec.compress_ratio)
            np.testing.assert_array_equal(table.sparse_indices, indices)
            np.testing.assert_array_equal(table.sparse_topk_lens, lens)
            assert table.seq_lens is None
        tables.join()
        stats = tables.stats
        assert stats["builds"] == {(0, "swa_only"): 1, (1, "swa_only"): 1, (0, "2:2:4"): 1,
                                   (1, "2:2:4"): 1}
        # Each run's first layer builds its group's table and forks the other group's.
        assert stats["forks"] == [(1, "swa_only"), (1, "2:2:4")]
        assert stats["waits"] == [1, 3]


def test_sparse_index_tables_lookup_arrays_are_read_only():
    """Every layer of a key in one SWA group gets views of the same table: the NumPy arrays
    lookup returns are read-only, so a write through one layer's cannot change another's."""
    rng = ref.fresh_rng()
    c = step_case(rng)
    specs = [smla.LayerSpec(layer=i, num_heads=4) for i in range(2)]  # group 0, swa_only
    tables = smla.SparseIndexTables(specs, "cpu")
    first, second = (tables.lookup(s.layer, lambda layer: index_args(c, 0)) for s in specs)
    assert tables.stats["builds"] == {(0, "swa_only"): 1}
    assert np.shares_memory(first.sparse_indices, second.sparse_indices)
    for array in (first.sparse_indices, first.sparse_topk_lens):
        assert not array.flags.writeable
        with pytest.raises(ValueError):
            array[0] = 0
        with pytest.raises(ValueError):
            array.flags.writeable = True
    indices, lens = expected_table(c, 0)
    np.testing.assert_array_equal(second.sparse_indices, indices)
    np.testing.assert_array_equal(second.sparse_topk_lens, lens)


def test_sparse_index_tables_refuse_calls_from_their_inputs():
    """`inputs` runs inside lookup: resetting, joining or looking up the same tables from there
    would free or fork under it, and is refused by name; the tables work on afterwards."""
    rng = ref.fresh_rng()
    c = step_case(rng)
    specs, _ = layers_and_pools(rng)
    tables = smla.SparseIndexTables(specs, "cpu")
    for call in ("reset", "join", "lookup"):
        def inputs(layer):
            if call == "lookup":
                tables.lookup(layer, inputs)
            else:
                getattr(tables, call)()
            return index_args(c, specs[layer].compress_ratio)
        with pytest.raises(ValueError, match=f"smla: inputs: .*, got a call to {call} from inside "
                           "lookup"):
            tables.lookup(0, inputs)
    tables.reset()
    table = tables.lookup(0, lambda layer: index_args(c, specs[layer].compress_ratio))
    np.testing.assert_array_equal(table.sparse_indices, expected_table(c, 0)[0])
    tables.join()


def test_sparse_index_tables_refuse_other_threads_while_they_look_up():
    """lookup builds without the GIL, so other threads run meanwhile: their calls on the same
    tables (here from a thread that `inputs` starts and joins) are refused by name."""
    rng = ref.fresh_rng()
    c = step_case(rng)
    specs, _ = layers_and_pools(rng)
    tables = smla.SparseIndexTables(specs, "cpu")
    refused = []

    def other_thread():
        try:
            tables.stats  # a property
        except ValueError as e:
            refused.append(str(e))

    def inputs(layer):
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        return index_args(c, specs[layer].compress_ratio)

    table = tables.lookup(0, inputs)
    assert refused and all("a call to stats from inside lookup" in e for e in refused), refused
    np.testing.assert_array_equal(table.sparse_indices, expected_table(c, 0)[0])
    assert tables.stats["builds"]  # and afterwards it is answered


def test_buffer_exporters_without_strides_cross():
    """A ctypes array exports its buffer without strides: it crosses as its memoryview does."""
    c = step_case(ref.fresh_rng())
    args = index_args(c, 0)
    pages = args.swa.block_table
    row = ctypes.c_int32 * pages.shape[1]
    args.swa.block_table = (row * pages.shape[0])(*[row(*r) for r in pages.tolist()])
    args.out = smla.SparseIndexTable(np.full((4, W), 12345, np.int32), np.full(4, -9, np.int32))
    smla.build_sparse_indices(args)
    indices, lens = expected_table(c, 0)
    np.testing.assert_array_equal(args.out.sparse_indices, indices)
    np.testing.assert_array_equal(args.out.sparse_topk_lens, lens)
    # The binding's own conversion too (it read the absent strides: a crash).
    t = smla._smla.Tensor((ctypes.c_int32 * 3 * 2)(), "x")
    assert (t.dtype, t.shape, t.strides) == ("i32", (2, 3), (3, 1))


def test_sparse_index_tables_hold_build_inputs_until_reset():
    """A forked build may read its inputs after lookup returns (on a side stream): the tables
    hold every array that `inputs` gave, even ones no one else holds, until reset()."""
    rng = ref.fresh_rng()
    c = step_case(rng)
    specs, _ = layers_and_pools(rng)
    given = []

    def inputs(layer):  # fresh arrays that only the returned args reference
        args = index_args(dict(c, block_table=c["block_table"].copy()),
                          specs[layer].compress_ratio)
        given.append(weakref.ref(args.swa.block_table))
        return args

    tables = smla.SparseIndexTables(specs, "cpu")
    for spec in specs:
        tables.lookup(spec.layer, inputs)
    gc.collect()
    assert len(given) == 4 and all(alive() is not None for alive in given)
    tables.reset()
    gc.collect()
    assert all(alive() is None for alive in given)


def test_table_arrays_outlive_reset_and_their_tables():
    """An array from lookup keeps its table: the next step's builds (other pages) and dropping
    the tables object leave it as it was."""
    rng = ref.fresh_rng()
    c = step_case(rng)
    specs, _ = layers_and_pools(rng)
    pages = [rng.permutation(40)[:16].reshape(4, 4).astype(np.int32) for _ in range(4)]

    def inputs_of(groups):
        return lambda layer: index_args(dict(c, block_table=groups[specs[layer].swa_group]),
                                        specs[layer].compress_ratio)

    tables = smla.SparseIndexTables(specs, "cpu")
    kept = [tables.lookup(s.layer, inputs_of(pages[:2])) for s in specs]
    for table in kept:  # views that hold what keeps the memory (no copy, no owner-less view)
        for array in (table.sparse_indices, table.sparse_topk_lens):
            assert not array.flags.owndata and array.base is not None
    expected = [(t.sparse_indices.copy(), t.sparse_topk_lens.copy()) for t in kept]
    tables.reset()
    for s in specs:
        tables.lookup(s.layer, inputs_of(pages[2:]))
    tables.reset()
    del tables
    gc.collect()
    for table, (indices, lens) in zip(kept, expected):
        np.testing.assert_array_equal(table.sparse_indices, indices)
        np.testing.assert_array_equal(table.sparse_topk_lens, lens)


def test_table_arrays_hold_the_tables_whose_streams_free_them():
    """A lookup's arrays hold the C++ tables object, whose streams take their memory back (on
    CUDA, after the work that last used it): one reference per lookup, gone with the arrays."""
    rng = ref.fresh_rng()
    c = step_case(rng)
    specs, _ = layers_and_pools(rng)
    tables = smla.SparseIndexTables(specs, "cpu")
    inner = tables._tables
    before = sys.getrefcount(inner)
    table = tables.lookup(specs[2].layer, lambda layer: index_args(c, specs[layer].compress_ratio))
    assert sys.getrefcount(inner) == before + 1
    del table
    gc.collect()
    assert sys.getrefcount(inner) == before


def test_sparse_index_tables_peak_bytes_outlast_a_drop():
    """A group holds one compressed key's table: a narrower one replaces it, so the bytes held
    drop while the peak stays."""
    rng = ref.fresh_rng()
    c = step_case(rng)
    narrow = dict(c, topk=c["topk"][:, :4])
    specs = [smla.LayerSpec(layer=0, compress_ratio=4, kv_source=0, index_source=0,
                            index_topk=12, num_heads=4),
             smla.LayerSpec(layer=1, compress_ratio=4, kv_source=1, index_source=1,
                            index_topk=4, num_heads=4)]
    cases = [c, narrow]
    tables = smla.SparseIndexTables(specs, "cpu")
    held = []
    for spec in specs:
        table = tables.lookup(spec.layer, lambda layer: index_args(cases[layer], 4))
        indices, lens = expected_table(cases[spec.layer], 4)
        np.testing.assert_array_equal(table.sparse_indices, indices)
        np.testing.assert_array_equal(table.sparse_topk_lens, lens)
        held.append(tables.stats["bytes"])
    stats = tables.stats
    assert 0 < held[1] < held[0]
    assert stats["bytes"] == held[1] and stats["peak_bytes"] == held[0]
    assert stats["peak_tables"] == {0: 1}
    tables.reset()
    assert tables.stats["bytes"] == 0 and tables.stats["peak_bytes"] == 0


def test_step_executor_matches_the_reference():
    rng = ref.fresh_rng()
    c = step_case(rng)
    specs, pools = layers_and_pools(rng)
    other_table = rng.permutation(40)[:16].reshape(4, 4).astype(np.int32)
    groups = [c["block_table"], other_table]
    sinks = rng.standard_normal(4).astype(np.float32)
    # Each layer's own scales (a layer taking another's, or 1, would show).
    layers = [smla.AttentionLayer(spec=s, swa_kv_cache=pools[i][0],
                                  bmm1_scale=D**-0.5 * (1 + i / 4), bmm2_scale=0.5 + i / 4,
                                  compressed_kv_cache=c["comp_view"] if s.compress_ratio else None,
                                  sinks=sinks if i % 2 else None)
              for i, s in enumerate(specs)]
    executor = smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12)
    tables = smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12, compressed_index="table")
    inputs = smla.StepInputs(metadata=c["step"], block_tables=groups,
                             compressed_block_tables={2: c["comp_table"]},
                             topk_indices={2: c["topk"]})
    queries = [rng.standard_normal((4, 4, D)).astype(BF16) for _ in specs]
    outs = [np.full((4, 6, D), np.nan, np.float32).astype(BF16) for _ in specs]
    executor.run_step(inputs, queries, outs)
    table_outs = [np.full_like(o, np.nan) for o in outs]
    tables.run_step(inputs, queries, table_outs)
    topk = smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12, compressed_index="topk")
    topk_outs = [np.full_like(o, np.nan) for o in outs]
    topk.run_step(inputs, queries, topk_outs)
    for a, b, t in zip(outs, table_outs, topk_outs):  # the top-k read by the decode: the table's
        assert (a.view(np.uint16) == b.view(np.uint16)).all()
        assert (t.view(np.uint16) == b.view(np.uint16)).all()
    assert tables.stats["forks"] == [(1, "swa_only"), (1, "2:2:4")]
    assert topk.stats["forks"] == [(1, "swa_only")]  # no table for the compressed key
    with pytest.raises(ValueError, match="smla: compressed_index:"):
        smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12, compressed_index="tables")
    with pytest.raises(ValueError, match="smla: layers:") as info:
        smla.StepExecutor([], max_tokens=8, max_columns=W + 12)
    assert (info.value.argument, info.value.got) == ("layers", "none")
    s = c["step"]
    for i, spec in enumerate(specs):
        indices, lens = expected_table(dict(c, block_table=groups[spec.swa_group]),
                                       spec.compress_ratio)
        expected, _ = ref.decode(queries[i].astype(np.float64), pools[i][1],
                                 c["comp"] if spec.compress_ratio else None, indices, lens,
                                 s.seq_lens, s.cum_seq_lens_q, layers[i].sinks,
                                 layers[i].bmm1_scale, layers[i].bmm2_scale, 6)
        got = outs[i].astype(np.float64)
        assert np.isfinite(got).all()
        ref.assert_out_close(got, expected, ref.CPU_TOL)
    assert executor.stats["forks"] == [(1, "swa_only")]  # the top-k, no other layer shares it
    # Layer by layer gives the same bits.
    again = [np.full_like(o, np.nan) for o in outs]
    executor.begin_step(inputs)
    for spec, q, o in zip(specs, queries, again):
        executor.run_layer(spec.layer, q, o)
    executor.end_step()
    for a, b in zip(outs, again):
        assert (a.view(np.uint16) == b.view(np.uint16)).all()
    # Errors name the layer: its number, or its position in the list.
    executor.begin_step(inputs)
    with pytest.raises(TypeError, match="smla: layer:"):
        executor.run_layer(True, queries[1], again[1])
    with pytest.raises(ValueError, match="smla: query:"):
        executor.run_layer(specs[1].layer, None, again[1])
    with pytest.raises(ValueError, match=rf"smla: query: .*\(layer {specs[1].layer}\)"):
        executor.run_layer(specs[1].layer, queries[1][:, :, :256], again[1])
    executor.run_layer(specs[1].layer, queries[1], again[1])  # refused above: runs again
    # Model order, each layer once a step (a later indexer may have overwritten its top-k).
    for spec in specs[:2]:
        with pytest.raises(ValueError, match=rf"smla: layer: .*after layer {specs[1].layer}"):
            executor.run_layer(spec.layer, queries[0], again[0])
    executor.end_step()
    odd = [dataclasses.replace(l, sinks=np.zeros(5, np.float32)) for l in layers]
    # Refused when made, before any layer of a step runs.
    with pytest.raises(ValueError, match=r"smla: layers\[0\].sinks: expected \[H="):
        smla.StepExecutor(odd, max_tokens=8, max_columns=W + 12)
    odd[1] = dataclasses.replace(layers[1], sinks=np.zeros(4))
    with pytest.raises(TypeError, match=r"smla: layers\[1\].sinks:"):
        smla.StepExecutor(odd, max_tokens=8, max_columns=W + 12)


def test_model_presets():
    names = [p.name for p in smla.model_presets()]
    assert names == ["v4-flash", "v4-pro", "v41-flash"]
    flash = smla.model_preset("v4-flash")
    assert flash.every_entry_ratio == 128  # its ratio-128 layers have no indexer
    layers = smla.model_layers(flash, 2, with_mtp=True)
    assert len(layers) == flash.num_layers + flash.num_mtp_layers
    assert layers[3].swa_group == 1 and layers[-1].mtp
    assert smla.sparse_index_key(layers[3], smla.TableSharing.none) != smla.sparse_index_key(
        layers[4], smla.TableSharing.none)
    # topk_width: a ratio-4 layer's index_topk (512), a ratio-128 layer's every entry
    # (max_seq_len / 128), an SWA-only layer's none.
    for max_seq_len in (4096, 100000):
        assert smla.topk_width(layers[2], max_seq_len) == flash.index_topk
        assert smla.topk_width(layers[3], max_seq_len) == max_seq_len // 128
        assert smla.topk_width(layers[43], max_seq_len) == 0
    # v41-flash shares caches and indexers: the layers its layers read them from are its lists.
    v41 = smla.model_preset("v41-flash")
    assert repr(v41) == "ModelPreset('v41-flash')"
    v41_layers = smla.model_layers(v41, 1)
    assert v41.kv_sources == sorted({s.kv_source for s in v41_layers} - {-1})
    assert v41.index_sources == sorted({s.index_source for s in v41_layers} - {-1})
    assert v41.kv_sources != v41.index_sources
    assert {(s.num_heads, s.window) for s in v41_layers} == {(v41.num_heads, v41.window)}
    with pytest.raises(ValueError, match="smla: name: expected one of v4-flash") as bad:
        smla.model_preset("v5")
    assert bad.value.argument == "name"


def test_layer_spec_takes_every_field():
    fields = dict(layer=5, swa_group=1, compress_ratio=4, kv_source=3, index_source=2,
                  index_topk=12, num_heads=8, window=64, mtp=True)
    spec = smla.LayerSpec(**fields)
    assert {k: getattr(spec, k) for k in fields} == fields
    assert repr(spec) == "LayerSpec(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"
    spec.mtp, spec.window = False, 128
    assert (spec.mtp, spec.window) == (False, 128)


# ---------------------------------------------------------------------------------------------
# Quantizers
# ---------------------------------------------------------------------------------------------

def test_quantize_kv_per_tensor_matches_an_e4m3_cast():
    rng = ref.fresh_rng()
    rows = (rng.standard_normal((40, D)) * 20).astype(BF16)  # |x| / kv_scale stays below 448
    pool = np.full((4, 16, D), np.nan, np.float32).astype(E4M3)
    slots = rng.permutation(64)[:40].astype(np.int32)
    slots[::7] = -1
    smla.quantize_kv(rows=rows, slots=slots, pool=pool, kv_scale=0.5)
    flat = pool.reshape(64, D)
    written = slots >= 0
    expected = (rows[written].astype(np.float32) / np.float32(0.5)).astype(E4M3)
    assert (flat[slots[written]].view(np.uint8) == expected.view(np.uint8)).all()
    untouched = np.setdiff1d(np.arange(64), slots[written])
    assert np.isnan(flat[untouched].astype(np.float32)).all(), "wrote a slot it was not given"


def ds_mla_rows(buf, block_size):
    """The float64 rows an fp8_ds_mla page buffer holds (SPEC §2), decoded here."""
    record = 576
    blocks = buf.shape[0]
    records = buf[:, :block_size * record].reshape(blocks, block_size, record)
    scales = buf[:, block_size * record:block_size * (record + 8)].reshape(blocks, block_size, 8)
    nope = records[:, :, :448].copy().view(E4M3).astype(np.float64)
    rope = records[:, :, 448:].copy().view(BF16).astype(np.float64)
    scale = np.repeat(2.0 ** (scales[:, :, :7].astype(np.float64) - 127), 64, axis=2)
    return np.concatenate([nope * scale, rope], axis=2)


def test_quantize_kv_fp8_ds_mla_feeds_the_decode_op():
    rng = ref.fresh_rng()
    blocks, block_size = 6, 16
    page = -(-block_size * 584 // 576) * 576
    buf = np.full((blocks, page), 0xAB, np.uint8)
    view = np.lib.stride_tricks.as_strided(buf, shape=(blocks, block_size, 584),
                                           strides=(page, 584, 1))
    n = blocks * block_size
    magnitudes = 2.0 ** rng.integers(-6, 7, (n, 8)).repeat(64, axis=1)
    rows = (rng.standard_normal((n, D)) * magnitudes).astype(BF16)
    smla.quantize_kv(rows=rows, slots=np.arange(n, dtype=np.int32), pool=view)
    # Byte for byte what docs/decode.md's rule gives: the smallest UE8M0 scale 2^(e - 127) that
    # keeps the group's max |x| within 448, then x * 2^(127 - e) cast to e4m3 (round to even).
    x = rows[:, :448].astype(np.float32).reshape(n, 7, 64)
    bits = np.abs(x).max(axis=2).view(np.uint32).astype(np.int64)
    e = (bits >> 23) - 8 + ((bits & 0x7fffff) > 0x600000)
    e = np.where(bits == 0, 127, np.maximum(e, 0)).astype(np.uint32)
    inverse = ((254 - e) << 23).astype(np.uint32).view(np.float32)
    codes = (x * inverse[:, :, None]).astype(E4M3).view(np.uint8).reshape(n, 448)
    records = buf[:, :block_size * 576].reshape(n, 576)
    scales = buf[:, block_size * 576:block_size * 584].reshape(n, 8)
    assert (records[:, :448] == codes).all()
    assert (scales[:, :7] == e).all()
    stored = ds_mla_rows(buf, block_size).reshape(n, D)
    assert (stored[:, 448:] == rows[:, 448:].astype(np.float64)).all()

    args, _ = make_case(rng, separate_pools=False)
    pool = ref.Pool(stored.reshape(blocks, block_size, D), block_size)
    args["swa_kv_cache"] = view
    args["sparse_indices"] = random_offsets(rng, pool, (args["query"].shape[0], W + 32))
    pools = {"swa": pool, "comp": None}
    expected_out, expected_lse = reference(args, pools)
    poison_unread(args, pools, poison_ds_mla(buf, block_size))
    smla.sparse_mla_decode(**args)
    check(args, expected_out, expected_lse, args["query"].shape[1])


@pytest.mark.parametrize("change,error,argument", [
    (lambda a: dict(a, rows=a["rows"].astype(np.float32)), TypeError, "rows"),
    (lambda a: dict(a, slots=np.array([0, 64], np.int32)), ValueError, "slots"),
    (lambda a: dict(a, kv_scale=0.0), ValueError, "kv_scale"),
    (lambda a: dict(a, kv_scale="x"), TypeError, "kv_scale"),
    (lambda a: dict(a, pool=read_only(a["pool"])), TypeError, "pool"),
    (lambda a: dict(a, rows=a["pool"].view(np.uint8).reshape(-1)[:2048].view(BF16)
                    .reshape(2, D)), ValueError, "pool"),
])
def test_quantize_kv_errors_name_the_argument(change, error, argument):
    args = dict(rows=np.zeros((2, D), np.float32).astype(BF16), slots=np.array([0, 1], np.int32),
                pool=np.zeros((4, 16, D), np.float32).astype(E4M3), kv_scale=1.0)
    with pytest.raises(error) as info:
        smla.quantize_kv(**change(args))
    assert info.value.argument == argument


def raises_named(error, argument, call):
    """call() raises `error` naming `argument`, as the message's first words and .argument."""
    with pytest.raises(error, match=f"^smla: {re.escape(argument)}: expected ") as info:
        call()
    assert info.value.argument == argument


def test_decode_checks_every_writable_and_read_only_argument():
    """workspace and kv_counters are written (on CUDA): read-only ones are refused on the CPU
    too; sinks are only read, so a read-only sinks array is taken."""
    args, pools = make_case(ref.fresh_rng())
    for name in ("workspace", "kv_counters"):
        raises_named(TypeError, name, lambda: smla.sparse_mla_decode(
            **dict(args, **{name: read_only(np.zeros(64, np.uint8))})))
    run_and_check(dict(args, sinks=read_only(args["sinks"])), pools)


def test_decode_defaults_and_scale_bounds():
    """bmm2_scale defaults to 1; a scale of 0 and float32's largest value are taken; a stream
    handle of 2^64 is refused like 2^70."""
    args, pools = make_case(ref.fresh_rng())
    run_and_check(args, pools)
    want = args["out"].copy()
    default = {k: v for k, v in args.items() if k != "bmm2_scale"}
    default["out"] = np.full_like(args["out"], np.nan)
    smla.sparse_mla_decode(**default)
    assert (default["out"].view(np.uint16) == want.view(np.uint16)).all()
    class Zero:  # converts by __float__ alone (no ==): taken as the 0.0 it converts to
        def __float__(self):
            return 0.0

    for value in (0.0, Zero()):
        zero = dict(args, bmm2_scale=value, out=np.full_like(args["out"], np.nan))
        smla.sparse_mla_decode(**zero)
        assert (zero["out"].astype(np.float32) == 0).all()
    rows = np.zeros((2, D), np.float32).astype(BF16)
    smla.quantize_kv(rows=rows, slots=np.array([0, 1], np.int32),
                     pool=np.zeros((4, 16, D), np.float32).astype(E4M3),
                     kv_scale=3.4028234663852886e38)
    raises_named(ValueError, "stream", lambda: smla.sparse_mla_decode(**args, stream=2**64))


def test_topk_columns_errors_name_the_field():
    c = step_case(ref.fresh_rng())
    s = c["step"]
    query = np.zeros((4, 4, D), np.float32).astype(BF16)
    common = dict(query=query, swa_kv_cache=c["swa_view"], compressed_kv_cache=c["comp_view"],
                  seq_lens=s.seq_lens, cum_seq_lens_q=s.cum_seq_lens_q, max_q_len=s.max_q_len,
                  bmm1_scale=D**-0.5, sparse_indices=np.zeros((4, W), np.int32),
                  sparse_topk_lens=None, out=np.zeros((4, 4, D), np.float32).astype(BF16))
    for field, value in (("block_table", c["comp_table"].astype(np.int64)),
                         ("is_valid_token", np.ones(4, bool))):  # refused on import
        topk = smla.TopkColumns(c["topk"], c["comp_table"], compress_ratio=4)
        setattr(topk, field, value)
        raises_named(TypeError, f"topk_columns.{field}",
                     lambda: smla.sparse_mla_decode(**common, topk_columns=topk))


def test_op_arguments_flatten_topk_columns_and_name_the_outputs():
    """Under torch.compile the call goes to torch.ops.smla.sparse_mla_decode with TopkColumns'
    fields flat and every output named (the traced path; its torch test skips without torch)."""
    from smla.decode import _op_arguments
    topk = smla.TopkColumns("indices", "table", 4, 2, "valid")
    got = _op_arguments(dict(query="q", out="o", topk_columns=topk, stream=None))
    assert got == dict(query="q", out="o", topk_indices="indices", topk_block_table="table",
                       compress_ratio=4, num_decodes=2, is_valid_token="valid", lse=None,
                       workspace=None, kv_counters=None)


def test_capability_defaults_to_the_cpu_and_checks_both_dtypes():
    assert smla.query_capability(512, "bf16", "bf16", 64) == (True, "")
    assert smla.max_topk_width() == 2**63 - 1
    raises_named(TypeError, "kv_dtype", lambda: smla.query_capability(512, "bf16", None, 64))


def test_capability_reads_each_dtype_as_its_own():
    """query_dtype is the query's and kv_dtype the cache's: a bf16 query reads an fp8_ds_mla
    (u8) cache, an f8e4m3 query no bf16 one."""
    assert smla.query_capability(512, "bf16", "u8", 64) == (True, "")
    supported, reason = smla.query_capability(512, "f8e4m3", "bf16", 64)
    assert not supported
    assert reason.startswith("query dtype f8e4m3 does not go with a bf16 cache"), reason


def test_engine_call_argument_checks():
    args, pools = make_case(ref.fresh_rng(), q_lens=(2, 2), seq_lens=(2, 260))
    common = {name: args[name] for name in (
        "swa_kv_cache", "compressed_kv_cache", "sparse_indices", "sparse_topk_lens", "seq_lens",
        "bmm1_scale", "sinks")}
    query4 = args["query"].reshape(2, 2, 8, D)
    # NumPy's False is no promise of offsets.
    raises_named(ValueError, "sparse_indices_are_storage_offsets",
                 lambda: trtllm_batch_decode_sparse_mla_dsv4(
                     query=query4, **common, sparse_indices_are_storage_offsets=np.False_))
    # A given max_q_len is the op's to check, for a [B, q, H, D] query too.
    raises_named(ValueError, "max_q_len", lambda: trtllm_batch_decode_sparse_mla_dsv4(
        query=query4, **common, max_q_len=1))
    # workspace_buffer and multi_ctas_kv_counter_buffer reach the op, whose errors name them so.
    raises_named(TypeError, "workspace_buffer", lambda: trtllm_batch_decode_sparse_mla_dsv4(
        query=query4, **common, workspace_buffer=np.zeros(64, np.float32)))
    raises_named(TypeError, "multi_ctas_kv_counter_buffer",
                 lambda: trtllm_batch_decode_sparse_mla_dsv4(
                     query=query4, **common, multi_ctas_kv_counter_buffer=np.zeros(64, np.float32)))
    out = np.zeros((2, 2, 8, D), BF16)
    with pytest.raises(ValueError) as info:  # named in what it overlaps, too
        trtllm_batch_decode_sparse_mla_dsv4(query=query4, **common, out=out,
                                            multi_ctas_kv_counter_buffer=out.view(np.uint8))
    assert "multi_ctas_kv_counter_buffer" in str(info.value)
    assert not re.search(r"\bkv_counters\b", str(info.value))
    # No query, no output to allocate: the named error, not an AttributeError.
    raises_named(ValueError, "query", lambda: trtllm_batch_decode_sparse_mla_dsv4(
        query=None, **common))
    # Device offsets cannot give max_q_len without a synchronisation.
    raises_named(ValueError, "max_q_len", lambda: trtllm_batch_decode_sparse_mla_dsv4(
        query=args["query"], **common, cum_seq_lens_q=_DlpackScalar(2, 0)))
    # Offsets NumPy cannot subtract: the op names them, not NumPy.
    raises_named(TypeError, "cum_seq_lens_q", lambda: trtllm_batch_decode_sparse_mla_dsv4(
        query=args["query"], **common, cum_seq_lens_q=np.array(["0", "2", "4"])))


def test_step_executor_argument_checks():
    rng = ref.fresh_rng()
    c = step_case(rng)
    specs, pools = layers_and_pools(rng)
    layers = [smla.AttentionLayer(spec=s, swa_kv_cache=pools[i][0], bmm1_scale=D**-0.5,
                                  compressed_kv_cache=c["comp_view"] if s.compress_ratio else None)
              for i, s in enumerate(specs)]
    raises_named(ValueError, "layers[0].swa_kv_cache", lambda: smla.StepExecutor(
        [dataclasses.replace(layers[0], swa_kv_cache=None)], 4, W + 12))
    raises_named(TypeError, "layers[1].bmm2_scale", lambda: smla.StepExecutor(
        [layers[0], dataclasses.replace(layers[1], bmm2_scale="x")], 4, W + 12))
    # Not a name: None or bytes would otherwise be refused as the text str() gives them.
    for kind in (None, b"auto", 1):
        raises_named(TypeError, "compressed_index", lambda: smla.StepExecutor(
            layers, 4, W + 12, compressed_index=kind))
    executor = smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12)
    inputs = smla.StepInputs(metadata=c["step"],
                             block_tables=[c["block_table"], c["block_table"]],
                             compressed_block_tables={2: c["comp_table"]},
                             topk_indices={2: c["topk"]})
    queries = [rng.standard_normal((4, 4, D)).astype(BF16) for _ in specs]
    outs = [np.zeros((4, 4, D), np.float32).astype(BF16) for _ in specs]
    raises_named(TypeError, "inputs", lambda: executor.begin_step(None))
    raises_named(TypeError, "compressed_block_tables key", lambda: executor.begin_step(
        dataclasses.replace(inputs, compressed_block_tables={"2": c["comp_table"]})))
    raises_named(ValueError, "queries[0]",
                 lambda: executor.run_step(inputs, [None] + queries[1:], outs))
    raises_named(TypeError, "outs[0]",
                 lambda: executor.run_step(inputs, queries, [read_only(outs[0])] + outs[1:]))
    executor.begin_step(inputs)
    raises_named(TypeError, "out", lambda: executor.run_layer(specs[0].layer, queries[0],
                                                              read_only(outs[0])))
    executor.end_step()


def test_step_inputs_dicts_take_none_as_empty_and_refuse_other_kinds():
    """compressed_block_tables and topk_indices default to empty dicts: None is one too (a
    model of SWA-only layers runs); a list or other non-dict is a TypeError naming the field."""
    rng = ref.fresh_rng()
    c = step_case(rng)
    specs, pools = layers_and_pools(rng)
    layers = [smla.AttentionLayer(spec=specs[i], swa_kv_cache=pools[i][0], bmm1_scale=D**-0.5)
              for i in range(2)]  # the two SWA-only layers
    executor = smla.StepExecutor(layers, max_tokens=8, max_columns=W)
    queries = [rng.standard_normal((4, 4, D)).astype(BF16) for _ in layers]
    outs = [np.full((4, 4, D), np.nan, np.float32).astype(BF16) for _ in layers]
    groups = [c["block_table"], c["block_table"]]
    executor.run_step(smla.StepInputs(c["step"], groups), queries, outs)
    want = [o.copy() for o in outs]
    none = smla.StepInputs(c["step"], groups, compressed_block_tables=None, topk_indices=None)
    for o in outs:
        o[:] = np.nan
    executor.run_step(none, queries, outs)
    for a, b in zip(outs, want):
        assert (a.view(np.uint16) == b.view(np.uint16)).all()
    executor.begin_step(none)
    executor.end_step()
    for name, value in (("compressed_block_tables", [c["comp_table"]]), ("topk_indices", []),
                        ("topk_indices", (c["topk"],)), ("compressed_block_tables", 2)):
        step = dataclasses.replace(none, **{name: value})
        for call in (lambda: executor.begin_step(step),
                     lambda: executor.run_step(step, queries, outs)):
            with pytest.raises(TypeError) as info:
                call()
            assert info.value.argument == name
            assert info.value.got == type(value).__name__
            assert str(info.value).startswith(f"smla: {name}: expected a dict {{")


def test_layer_specs_are_checked_when_tables_and_executors_are_made():
    """A window below 1 is refused by the StepExecutor and SparseIndexTables constructors,
    named as their other spec fields are (it failed only at run_step); sparse_index_key refuses
    the specs topk_width refuses, in the same words."""
    rng = ref.fresh_rng()
    specs, pools = layers_and_pools(rng)
    for window in (0, -5):
        spec = smla.LayerSpec(layer=0, num_heads=4, window=window)
        layer = smla.AttentionLayer(spec=spec, swa_kv_cache=pools[0][0], bmm1_scale=D**-0.5)
        raises_named(ValueError, "layers[0].spec.window",
                     lambda: smla.StepExecutor([layer], max_tokens=8, max_columns=W))
        raises_named(ValueError, "layers[1].window", lambda: smla.SparseIndexTables(
            [specs[0], smla.LayerSpec(layer=1, swa_group=1, num_heads=4, window=window)]))
    raises_named(ValueError, "layers[0].compress_ratio", lambda: smla.SparseIndexTables(
        [smla.LayerSpec(layer=0, num_heads=4, compress_ratio=-1)]))
    for spec, field in ((smla.LayerSpec(compress_ratio=-1), "layer.compress_ratio"),
                        (smla.LayerSpec(compress_ratio=4, index_topk=-8), "layer.index_topk"),
                        (smla.LayerSpec(window=0), "layer.window")):
        with pytest.raises(ValueError) as width:
            smla.topk_width(spec, 1024)
        for sharing in (smla.TableSharing.shared, smla.TableSharing.none):
            with pytest.raises(ValueError) as key:
                smla.sparse_index_key(spec, sharing)
            assert key.value.argument == field
            assert str(key.value) == str(width.value)


def test_index_builder_argument_checks():
    c = step_case(ref.fresh_rng())
    args = index_args(c, 4)
    k = W + 12
    raises_named(TypeError, "step", lambda: smla.build_sparse_indices(
        dataclasses.replace(args, step=None)))
    raises_named(TypeError, "out", lambda: smla.build_sparse_indices(dataclasses.replace(
        args, out=(np.zeros((4, k), np.int32), np.zeros(4, np.int32)))))
    for name in ("sparse_indices", "sparse_topk_lens"):
        out = smla.SparseIndexTable(np.zeros((4, k), np.int32), np.zeros(4, np.int32))
        setattr(out, name, read_only(getattr(out, name)))
        raises_named(TypeError, name, lambda: smla.build_sparse_indices(
            dataclasses.replace(args, out=out)))
    # DSpark writes out.seq_lens: a read-only one is refused before anything is written.
    d = step_case(ref.fresh_rng(), q_lens=(1, 3, 2), seq_lens=(5, 200, 131))
    d["step"].decode_swa_width = width = smla.dspark_swa_width(W, 3)
    seq_lens = read_only(np.full(6, -9, np.int32))
    out = smla.SparseIndexTable(np.zeros((6, width), np.int32), np.zeros(6, np.int32), seq_lens)
    raises_named(TypeError, "out.seq_lens", lambda: smla.build_sparse_indices(smla.SparseIndexArgs(
        step=d["step"], swa=smla.SwaGroup(d["block_table"], d["swa_view"]), out=out)))
    assert (seq_lens == -9).all()
    comp = dataclasses.replace(args.compressed, block_table=c["comp_table"].astype(np.int64))
    raises_named(TypeError, "compressed.block_table", lambda: smla.build_sparse_indices(
        dataclasses.replace(args, compressed=comp, out=smla.SparseIndexTable(
            np.zeros((4, k), np.int32), np.zeros(4, np.int32)))))


def test_sparse_index_tables_argument_checks():
    c = step_case(ref.fresh_rng())
    specs = four_layers(4)
    tables = smla.SparseIndexTables(specs)  # the CPU by default
    table = tables.lookup(0, lambda layer: index_args(c, specs[layer].compress_ratio))
    np.testing.assert_array_equal(table.sparse_indices, expected_table(c, 0)[0])
    tables.reset()
    raises_named(TypeError, "layer", lambda: tables.lookup(True, lambda layer: index_args(c, 0)))
    raises_named(TypeError, "layers", lambda: smla.SparseIndexTables("v4-flash"))


def test_sparse_index_tables_check_what_inputs_gives():
    """lookup's `inputs` must be a callable returning a SparseIndexArgs (a TypeError naming
    inputs, not "'int' object is not callable"), whose compress_ratio and window are the
    layer's and whose outputs are unset (ValueError naming the field: another ratio built
    another table under the layer's key, outputs went unwritten)."""
    c = step_case(ref.fresh_rng())
    specs = four_layers(4)
    tables = smla.SparseIndexTables(specs)
    for inputs, got in ((5, "int"), (None, "NoneType"), ([index_args(c, 0)], "list")):
        with pytest.raises(TypeError) as info:
            tables.lookup(2, inputs)
        assert str(info.value) == ("smla: inputs: expected a callable: inputs(layer) -> "
                                   f"SparseIndexArgs, got {got}")
    with pytest.raises(TypeError) as info:
        tables.lookup(1, lambda layer: None)
    assert str(info.value) == ("smla: inputs: expected a callable that returns a "
                               "SparseIndexArgs, got NoneType from inputs(1)")

    def refused(layer, change, argument, expected, got):
        def inputs(other):
            args = index_args(c, specs[other].compress_ratio)
            change(args)
            return args
        with pytest.raises(ValueError) as info:
            tables.lookup(layer, inputs)
        assert (info.value.argument, info.value.expected) == (argument, expected)
        assert info.value.got.startswith(got + f" (the table of layer {layer}, SWA group ")
        assert tables.stats["builds"] == {}  # nothing built under the key
        tables.reset()

    def ratio(value):
        return lambda args: setattr(args, "compressed", index_args(c, value).compressed)
    refused(2, ratio(0), "compress_ratio", "4, the layer's (its LayerSpec)", "0")
    refused(0, ratio(4), "compress_ratio", "0, the layer's (its LayerSpec)", "4")
    refused(1, lambda args: setattr(args, "window", 64), "window",
            "128, the layer's (its LayerSpec)", "64")
    out = smla.SparseIndexTable(np.zeros((4, W), np.int32), np.zeros(4, np.int32))
    refused(0, lambda args: setattr(args, "out", out), "out.sparse_indices",
            "unset (the tables allocate their own)", f"i32[4, {W}] cpu")
    table = tables.lookup(2, lambda layer: index_args(c, specs[layer].compress_ratio))
    np.testing.assert_array_equal(table.sparse_indices, expected_table(c, 4)[0])


def test_quantize_kv_defaults_and_names():
    rng = ref.fresh_rng()
    rows = (rng.standard_normal((8, D)) * 20).astype(BF16)
    pool = np.full((4, 16, D), np.nan, np.float32).astype(E4M3)
    slots = np.arange(8, dtype=np.int32)
    smla.quantize_kv(rows=rows, slots=slots, pool=pool)  # kv_scale 1: a plain e4m3 cast
    expected = rows.astype(np.float32).astype(E4M3)
    assert (pool.reshape(64, D)[:8].view(np.uint8) == expected.view(np.uint8)).all()
    raises_named(ValueError, "rows", lambda: smla.quantize_kv(rows=None, slots=slots, pool=pool))
    raises_named(TypeError, "slots", lambda: smla.quantize_kv(
        rows=rows, slots=slots.astype(np.int64), pool=pool))



def test_names_utf8_cannot_hold_are_refused_by_their_argument():
    """A name with a lone surrogate (how os.fsdecode keeps undecodable bytes) has no UTF-8 form
    to cross to C++ in: it is refused as any unknown name is, by the library's ValueError
    naming the argument, with the character escaped (nanobind had raised its own unnamed
    "incompatible function arguments" TypeError; a fuzzer's finding)."""
    args, _ = make_case(ref.fresh_rng())
    _, layers, _, _ = _executor_case(ref.fresh_rng())
    query = smla.with_dtype(args["query"].view(np.uint16), "bf16\udcff")
    for argument, call in (
            ("name", lambda: smla.model_preset("v4-flash\udcff")),
            ("query_dtype", lambda: smla.query_capability(D, "\ud800", "bf16", 64)),
            ("kv_dtype", lambda: smla.query_capability(D, "bf16", "u8\udfff", 64)),
            ("query", lambda: smla.sparse_mla_decode(**bad(args, query=query))),
            ("compressed_index", lambda: smla.StepExecutor(layers, max_tokens=8, max_columns=W,
                                                           compressed_index="auto\udcff"))):
        with pytest.raises(ValueError, match=f"^smla: {argument}: expected ") as info:
            call()
        assert info.value.argument == argument
        assert re.search(r"\\ud[89a-f][0-9a-f]{2}", info.value.got), info.value.got


def test_names_with_a_nul_are_refused_with_all_their_text():
    """A NUL inside a name ends a C string: the library's message, and its got, stopped there
    ("expected one of v4-flash, v4-pro, v41-flash, got v4-flash" for "v4-flash\\0"; a
    fuzzer's finding). The character is escaped as it crosses, so all of the name is said."""
    args, _ = make_case(ref.fresh_rng())
    query = smla.with_dtype(args["query"].view(np.uint16), "bf16\0")
    for argument, call, got in (
            ("name", lambda: smla.model_preset("v4-flash\0"), "v4-flash\\x00"),
            ("kv_dtype", lambda: smla.query_capability(D, "bf16", "u8\0x", 64), "u8\\x00x"),
            ("query", lambda: smla.sparse_mla_decode(**bad(args, query=query)), "bf16\\x00")):
        with pytest.raises(ValueError, match=f"^smla: {argument}: expected ") as info:
            call()
        assert (info.value.argument, info.value.got) == (argument, got)
        assert str(info.value).endswith(f", got {got}")


def test_stream_objects_use_cuda_stream_first():
    """A stream object's .cuda_stream is its handle (PyTorch's), .ptr only without one (CuPy's)."""
    args, _ = make_case(ref.fresh_rng())

    class Both:
        cuda_stream, ptr = 0, "not read"

    class OnlyPtr:
        ptr = 0

    class TextPtr:
        ptr = "abc"

    smla.sparse_mla_decode(**args, stream=Both())
    smla.sparse_mla_decode(**args, stream=OnlyPtr())
    with pytest.raises(TypeError, match=r"^smla: stream: expected a stream object whose \.ptr is "
                                        r"an int, got 'abc'$"):
        smla.sparse_mla_decode(**args, stream=TextPtr())


def test_dtype_errors_name_the_conversion_for_other_widths():
    """uint32/int16 indices get the int32 conversion, a float16 query the float32/bf16 one."""
    args, _ = make_case(ref.fresh_rng())
    for name, dtype in (("seq_lens", np.uint32), ("sparse_indices", np.uint64),
                        ("sparse_topk_lens", np.int16)):
        with pytest.raises(TypeError) as info:
            smla.sparse_mla_decode(**bad(args, **{name: args[name].astype(dtype)}))
        assert info.value.argument == name
        assert info.value.got.startswith(
            f"{np.dtype(dtype).name}: indices, lengths and offsets are int32"), info.value.got
    with pytest.raises(TypeError) as info:
        smla.sparse_mla_decode(**bad(args, query=args["query"].astype(np.float16)))
    assert info.value.argument == "query"
    assert info.value.got == ("float16: rows are bf16 (.to(torch.bfloat16) or "
                              ".astype(ml_dtypes.bfloat16))"), info.value.got


def test_dtype_errors_follow_the_dtype_the_argument_takes():
    """The expectation and the conversion named are the argument's (u8 flags and buffers, an
    fp8_ds_mla pool's bytes, f32 sinks, bf16 rows), not guessed from the dtype that came."""
    rng = ref.fresh_rng()
    args, _ = make_case(rng)
    view = ".view(torch.uint8) or .view(numpy.uint8))"
    pools = ("bf16, f8e4m3 (float8_e4m3fn) or u8 elements (a uint16/uint8 array holding "
             "bf16/fp8 bits: smla.with_dtype(array, 'bf16'/'f8e4m3'))")
    c = step_case(rng)
    step = dataclasses.replace(c["step"], is_valid_token=np.ones(4, np.int8))
    table = smla.SparseIndexArgs(step=step, swa=smla.SwaGroup(c["block_table"], c["swa_view"]),
                                 out=smla.SparseIndexTable(np.zeros((4, W), np.int32),
                                                           np.zeros(4, np.int32)))
    pool8 = np.zeros((2, 16, 584), np.int8)
    quantize = dict(rows=np.zeros((2, D), BF16), slots=np.array([0, 1], np.int32), pool=pool8)
    for argument, call, expected, got in (
            ("is_valid_token", lambda: smla.build_sparse_indices(table), "u8 elements",
             "int8: flags and buffers are u8 (" + view),
            ("workspace", lambda: smla.sparse_mla_decode(
                **bad(args, workspace=np.zeros(64, np.int8))), "u8 elements",
             "int8: flags and buffers are u8 (" + view),
            # It takes i32 too: both named, and a buffer's view, not an index's int32 copy.
            ("kv_counters", lambda: smla.sparse_mla_decode(
                **bad(args, kv_counters=np.zeros(16, np.int16))), "u8 or i32 elements",
             "int16: counters are a u8 or i32 buffer (its bytes: " + view),
            ("kv_counters", lambda: smla.sparse_mla_decode(
                **bad(args, kv_counters=np.zeros(16, np.int64))), "u8 or i32 elements",
             "int64: counters are a u8 or i32 buffer (its bytes: " + view),
            ("swa_kv_cache", lambda: smla.sparse_mla_decode(**bad(args, swa_kv_cache=pool8)),
             pools, "int8: an fp8_ds_mla pool is u8 (" + view),
            ("pool", lambda: smla.quantize_kv(**quantize), pools,
             "int8: an fp8_ds_mla pool is u8 (" + view),
            ("slots", lambda: smla.quantize_kv(**dict(quantize, pool=pool8.view(np.uint8),
                                                      slots=np.array([0, 1], np.int64))),
             "i32 elements",
             "int64: indices, lengths and offsets are int32 (.to(torch.int32) or "
             ".astype(numpy.int32))"),
            ("sinks", lambda: smla.sparse_mla_decode(
                **bad(args, sinks=args["sinks"].astype(np.float16))), "f32 elements",
             "float16: sinks and lse are float32 (.float() or .astype(numpy.float32))"),
            ("out", lambda: smla.sparse_mla_decode(**bad(args, out=np.zeros((6, 8, D)))),
             "bf16 elements (a uint16 array holding bf16 bits: smla.with_dtype(array, 'bf16'))",
             "float64: rows are bf16 (.to(torch.bfloat16) or .astype(ml_dtypes.bfloat16))"),
            ("sparse_indices", lambda: smla.sparse_mla_decode(
                **bad(args, sparse_indices=args["sparse_indices"].astype(np.float64))),
             "i32 elements", "float64"),  # no conversion: float indices are no int32's copy
            # An smla dtype the argument does not take: named as the others, the conversion too.
            ("query", lambda: smla.sparse_mla_decode(
                **bad(args, query=args["query"].astype(np.float32))),
             "bf16 or f8e4m3 (float8_e4m3fn) elements (a uint16/uint8 array holding bf16/fp8 "
             "bits: smla.with_dtype(array, 'bf16'/'f8e4m3'))",
             "float32: rows are bf16 (.to(torch.bfloat16) or .astype(ml_dtypes.bfloat16))"),
            ("sinks", lambda: smla.sparse_mla_decode(
                **bad(args, sinks=args["sinks"].astype(np.int32))), "f32 elements", "int32"),
            ("sparse_indices", lambda: smla.sparse_mla_decode(
                **bad(args, sparse_indices=args["sparse_indices"].astype(np.float32))),
             "i32 elements", "float32"),
    ):
        with pytest.raises(TypeError) as info:
            call()
        assert (info.value.argument, info.value.expected, info.value.got) == \
            (argument, expected, got)
        assert str(info.value) == f"smla: {argument}: expected {expected}, got {got}"


def test_raw_bits_without_with_dtype_are_pointed_to_it():
    """A uint16 array of bf16 bits (an engine's raw view) is refused with the with_dtype that
    reads it and no conversion: .astype or a flags' .to would change the values."""
    args, _ = make_case(ref.fresh_rng())
    for name, expected in (
            ("query", "bf16 or f8e4m3 (float8_e4m3fn) elements (a uint16/uint8 array holding "
                      "bf16/fp8 bits: smla.with_dtype(array, 'bf16'/'f8e4m3'))"),
            ("swa_kv_cache", "bf16, f8e4m3 (float8_e4m3fn) or u8 elements (a uint16/uint8 "
                             "array holding bf16/fp8 bits: smla.with_dtype(array, "
                             "'bf16'/'f8e4m3'))"),
            ("out", "bf16 elements (a uint16 array holding bf16 bits: "
                    "smla.with_dtype(array, 'bf16'))")):
        with pytest.raises(TypeError) as info:
            smla.sparse_mla_decode(**bad(args, **{name: args[name].view(np.uint16)}))
        assert (info.value.argument, info.value.expected, info.value.got) == \
            (name, expected, "uint16")


def test_bool_and_complex_arrays_are_named_by_their_dtype():
    """A bool mask (what an engine may hold as is_valid_token) is named bool, with the u8 view
    of its bytes; a complex query complex64: not the integer or float type of their width."""
    rng = ref.fresh_rng()
    args, _ = make_case(rng)
    c = step_case(rng)
    mask = rng.random(c["step"].num_tokens) < 0.7
    step = dataclasses.replace(c["step"], is_valid_token=mask)
    table = smla.SparseIndexArgs(step=step, swa=smla.SwaGroup(c["block_table"], c["swa_view"]),
                                 out=smla.SparseIndexTable(np.zeros((4, W), np.int32),
                                                           np.zeros(4, np.int32)))
    with pytest.raises(TypeError) as info:
        smla.build_sparse_indices(table)
    assert (info.value.argument, info.value.got) == \
        ("is_valid_token", "bool: flags and buffers are u8 (.view(torch.uint8) or "
                           ".view(numpy.uint8))")
    query = args["query"].astype(np.float32) + 1j * rng.standard_normal(args["query"].shape)
    with pytest.raises(TypeError) as info:
        smla.sparse_mla_decode(**bad(args, query=query.astype(np.complex64)))
    assert (info.value.argument, info.value.got) == ("query", "complex64")


@pytest.mark.parametrize("output", ["out", "lse", "workspace", "kv_counters"])
def test_read_only_outputs_are_named_as_such(output):
    args, _ = make_case(ref.fresh_rng())
    array = np.zeros(64, np.uint8) if output in ("workspace", "kv_counters") else args[output]
    with pytest.raises(TypeError) as info:
        smla.sparse_mla_decode(**dict(args, **{output: read_only(array)}))
    assert (info.value.argument, info.value.got) == (output, "a read-only array")
    assert info.value.expected.startswith("a writable array")


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DLTENSOR = b"dltensor"
# DLPack device types and type codes
CPU, CUDA, CUDA_HOST, OPENCL, CUDA_MANAGED = 1, 2, 3, 4, 13
INT, UINT, FLOAT, BFLOAT, FLOAT8_E4M3FN = 0, 1, 2, 4, 10


class DlpackExport:
    """A NumPy array's host memory exported by DLPack (an unversioned capsule, no deleter) as
    memory of DLPack device type `device_type`, its elements of type code `code` (as a GPU
    framework's pinned or managed memory, or a dtype NumPy lacks, would cross), in `lanes`
    lanes of bits a lane as many as the array's, on device index `device_id`. The capsules'
    structs live as long as this object."""

    def __init__(self, array, device_type, code, lanes=1, device_id=0):
        self.array, self.device_type, self.code, self._held = array, device_type, code, []
        self.lanes, self.device_id = lanes, device_id

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __dlpack__(self, **kwargs):
        a = self.array
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        strides = (ctypes.c_int64 * a.ndim)(*(s // a.itemsize for s in a.strides))
        managed = _DLManagedTensor()
        managed.dl_tensor = _DLTensor(a.ctypes.data, _DLDevice(self.device_type, self.device_id),
                                      a.ndim, _DLDataType(self.code, a.itemsize * 8, self.lanes),
                                      shape, strides, 0)
        self._held.append((shape, strides, managed))
        return _capsule_new(ctypes.addressof(managed), _DLTENSOR, None)


def test_pinned_host_memory_runs_on_the_cpu():
    """DLPack's CUDA host (pinned) memory is host memory: read and written by the CPU call."""
    args, pools = make_case(ref.fresh_rng())
    expected_out, expected_lse = reference(args, pools)
    poison_unread(args, pools)
    smla.sparse_mla_decode(**dict(
        args, query=DlpackExport(args["query"].view(np.uint16), CUDA_HOST, BFLOAT),
        out=DlpackExport(args["out"].view(np.uint16), CUDA_HOST, BFLOAT),
        sinks=DlpackExport(args["sinks"], CUDA_HOST, FLOAT)))
    check(args, expected_out, expected_lse, args["query"].shape[1])


@pytest.mark.parametrize("device_type", [CUDA, CUDA_MANAGED])
def test_managed_memory_is_a_cuda_array(device_type):
    """A CUDA or CUDA managed query makes it a call on cuda:0, which CPU pools are not on (a
    CPU call would read memory the GPU may still be writing)."""
    args, _ = make_case(ref.fresh_rng())
    query = DlpackExport(args["query"].view(np.uint16), device_type, BFLOAT)
    with pytest.raises(TypeError, match=r"^smla: swa_kv_cache: expected cuda:0 \(the device "
                       r"of the call\), got cpu") as info:
        smla.sparse_mla_decode(**dict(args, query=query))
    assert info.value.argument == "swa_kv_cache"


def test_a_cuda_query_makes_the_call_on_its_own_device():
    """The device of the call is the query's, its index too: on cuda:1, that is the device
    the CPU pools are named as not on (one GPU's call cannot read another's memory)."""
    args, _ = make_case(ref.fresh_rng())
    query = DlpackExport(args["query"].view(np.uint16), CUDA, BFLOAT, device_id=1)
    with pytest.raises(TypeError, match=r"^smla: swa_kv_cache: expected cuda:1 \(the device "
                       r"of the call\), got cpu$") as info:
        smla.sparse_mla_decode(**dict(args, query=query))
    assert info.value.argument == "swa_kv_cache"


def test_arrays_on_other_devices_are_refused():
    args, _ = make_case(ref.fresh_rng())
    query = DlpackExport(args["query"].view(np.uint16), OPENCL, BFLOAT)
    with pytest.raises(TypeError, match="^smla: query: expected an array on the CPU or a CUDA "
                       "device, got DLPack device type 4$") as info:
        smla.sparse_mla_decode(**dict(args, query=query))
    assert info.value.argument == "query"


def test_dlpack_float8_e4m3fn_reads_as_fp8():
    """An array exported with DLPack's float8_e4m3fn code (JAX, newer frameworks) is an fp8
    array, read as the same bits with_dtype(..., "f8e4m3") names."""
    rng = ref.fresh_rng()
    args, _ = make_case(rng, separate_pools=False, sinks=None)
    view, _ = bf16_pool(rng, 12, 16, 20, dtype=E4M3)
    query = (rng.standard_normal(args["query"].shape) * 4).astype(E4M3)
    args.update(query=query, swa_kv_cache=view, bmm1_scale=D**-0.5 / 8, bmm2_scale=0.5)
    smla.sparse_mla_decode(**args)
    want = args["out"].copy()
    assert np.isfinite(want.astype(np.float32)).all()
    for name in ("query", "swa_kv_cache"):
        args["out"][:] = np.nan
        export = DlpackExport(args[name].view(np.uint8), CPU, FLOAT8_E4M3FN)
        smla.sparse_mla_decode(**dict(args, **{name: export}))
        assert (args["out"].view(np.uint16) == want.view(np.uint16)).all(), name


@pytest.mark.parametrize("ndim", [5, 8, 32])
def test_arrays_of_too_many_dims_are_refused(ndim):
    """Past 4 dims an array is refused on import (the view holds 4: a wider one would write
    past it)."""
    args, _ = make_case(ref.fresh_rng())
    for name in ("query", "sparse_indices", "out"):
        wide = args[name].reshape((1,) * (ndim - args[name].ndim) + args[name].shape)
        with pytest.raises(ValueError) as info:
            smla.sparse_mla_decode(**dict(args, **{name: wide}))
        assert (info.value.argument, info.value.got) == (name, f"{ndim} dims")


def _executor_case(rng):
    c = step_case(rng)
    specs, pools = layers_and_pools(rng)
    layers = [smla.AttentionLayer(spec=s, swa_kv_cache=pools[i][0], bmm1_scale=D**-0.5,
                                  compressed_kv_cache=c["comp_view"] if s.compress_ratio else None)
              for i, s in enumerate(specs)]
    inputs = smla.StepInputs(metadata=c["step"], block_tables=[c["block_table"]] * 2,
                             compressed_block_tables={2: c["comp_table"]},
                             topk_indices={2: c["topk"]})
    queries = [rng.standard_normal((4, 4, D)).astype(BF16) for _ in specs]
    return specs, layers, inputs, queries


class _Interrupting:
    """An array whose export is interrupted (Ctrl-C while the call takes its arguments)."""

    def __dlpack__(self, *args, **kwargs):
        raise KeyboardInterrupt

    def __dlpack_device__(self):
        return (1, 0)


def test_step_executor_run_layer_refused_in_python_joins_first():
    """A run_layer whose arguments the package refuses before the library sees them (a layer
    that is no int, a query of None, an out it cannot write) joins the side stream first, as a
    call the library refuses does, so that a capture of the step can still end; so does one
    interrupted while its arrays are taken (KeyboardInterrupt is no Exception). Layer 2's
    lookup forks a table of SWA group 1 that layer 3 reads: after a join, layer 3 finds it
    ready (no wait); those refusals had left it pending (found reviewing run_layer's
    refusals)."""
    rng = ref.fresh_rng()
    specs, layers, inputs, queries = _executor_case(rng)
    other_table = rng.permutation(40)[:16].reshape(4, 4).astype(np.int32)
    inputs.block_tables = [inputs.block_tables[0], other_table]
    executor = smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12)
    assert [s.swa_group for s in specs[2:]] == [0, 1]

    def out():
        return np.zeros((4, 4, D), np.float32).astype(BF16)

    for error, refused in (
            (ValueError, lambda: executor.run_layer(3, queries[3][:1], out())),  # the library's
            (TypeError, lambda: executor.run_layer("3", queries[3], out())),
            (ValueError, lambda: executor.run_layer(3, None, out())),
            (TypeError, lambda: executor.run_layer(3, queries[3], np.broadcast_to(
                out(), (4, 4, D)))),
            (KeyboardInterrupt, lambda: executor.run_layer(3, _Interrupting(), out()))):
        executor.begin_step(inputs)
        executor.run_layer(2, queries[2], out())
        assert [group for group, _ in executor.stats["forks"]] == [1]
        with pytest.raises(error):
            refused()
        executor.run_layer(3, queries[3], out())  # the step stays begun
        assert executor.stats["waits"] == [], refused
        executor.end_step()


@pytest.mark.parametrize("compressed_index", ["table", "topk", "auto"])
def test_step_executor_errors_name_the_step_inputs_fields(compressed_index):
    """A block table, compressed block table or top-k that a table build or a decode refuses
    is named as the StepInputs field it came in, keyed as given (not as the build's block_table
    or the decode's topk_columns), in the argument and the expected and got texts alike, with
    the layer (and table) it failed in."""
    rng = ref.fresh_rng()
    specs, layers, inputs, queries = _executor_case(rng)
    other_table = rng.permutation(40)[:16].reshape(4, 4).astype(np.int32)
    inputs.block_tables = [inputs.block_tables[0], other_table]
    executor = smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12,
                                 compressed_index=compressed_index)
    outs = [np.full((4, 4, D), np.nan, np.float32).astype(BF16) for _ in specs]
    executor.run_step(inputs, queries, outs)  # as given, they run
    short = np.zeros((1, 4), np.int32)
    past = inputs.topk_indices[2].copy()
    past[0] = -1
    past[0, 0] = 4 * 16  # token 0 (a decode token): past its 4 pages of E = 16 entries
    for argument, spoiled, texts in (
            ("compressed_block_tables[2]",
             dataclasses.replace(inputs, compressed_block_tables={2: short}), ""),
            ("topk_indices[2]",
             dataclasses.replace(inputs, topk_indices={2: inputs.topk_indices[2][:3]}), ""),
            ("block_tables[1]", dataclasses.replace(inputs, block_tables=[
                inputs.block_tables[0], other_table[:1]]), ""),
            ("topk_indices[2]", dataclasses.replace(inputs, topk_indices={2: past}),
             "local indices below compressed_block_tables[2] pages * E = 64, "
             "got topk_indices[2][0][0] = 64 (")):
        with pytest.raises(ValueError, match=f"^smla: {re.escape(argument)}: expected ") as info:
            executor.run_step(spoiled, queries, outs)
        assert info.value.argument == argument
        assert texts in str(info.value)
        assert not re.search(r"block_table\b|topk_columns", str(info.value))
        assert re.search(r"\((layer \d+|the table of layer \d+, SWA group \d+)\)$",
                         info.value.got), info.value.got


@pytest.mark.parametrize("by_layer", [False, True])
def test_step_executor_refuses_every_call_while_a_thread_runs_it(by_layer):
    """While another thread's run_step, or run_layer, runs without the GIL, run_step, run_layer,
    end_step and stats from this thread are refused by name (they would interleave layers or
    reset the tables read); the running thread's steps give the one-thread bits."""
    rng = ref.fresh_rng()
    specs, layers, inputs, queries = _executor_case(rng)
    executor = smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12)
    want = [np.full((4, 4, D), np.nan, np.float32).astype(BF16) for _ in specs]
    executor.run_step(inputs, queries, want)
    assert all(np.isfinite(w.astype(np.float32)).all() for w in want)  # every out written
    got = [np.full_like(o, np.nan) for o in want]
    mine = [np.full_like(o, np.nan) for o in want]
    stop, errors = threading.Event(), []
    busy = "while another thread's run_layer or run_step runs"

    def one_step():
        if not by_layer:
            return executor.run_step(inputs, queries, got)
        executor.begin_step(inputs)
        for spec, q, o in zip(specs, queries, got):
            executor.run_layer(spec.layer, q, o)
        executor.end_step()

    def steps():
        try:
            for _ in range(20000):
                if stop.is_set():
                    break
                try:
                    one_step()
                except ValueError as e:  # refused while this thread's own call ran
                    if busy not in str(e):
                        raise
                    continue
                if not all((a.view(np.uint16) == b.view(np.uint16)).all()
                           for a, b in zip(got, want)):
                    errors.append("a step's outputs differ")
        except Exception as e:
            errors.append(repr(e))
        finally:
            stop.set()

    calls = {"stats": lambda: executor.stats}
    if not by_layer:  # between two steps these run (a run_layer of the ended step: its error)
        calls.update(run_step=lambda: executor.run_step(inputs, queries, mine),
                     run_layer=lambda: executor.run_layer(specs[0].layer, queries[0], mine[0]),
                     end_step=executor.end_step,
                     begin_step=lambda: executor.begin_step(inputs))
    refused = set()
    thread = threading.Thread(target=steps)
    thread.start()
    deadline = time.monotonic() + 60
    while not stop.is_set() and refused != set(calls) and time.monotonic() < deadline:
        for name, call in calls.items():
            try:
                call()
            except ValueError as e:
                if busy in str(e):
                    assert e.argument == name
                    refused.add(name)
    stop.set()
    thread.join()
    assert not errors, errors[:3]
    assert refused == set(calls)


def test_sparse_index_tables_hold_every_build_input_until_reset():
    """Every array `inputs` gives is held until reset though only the returned args reference
    it: the step's metadata, the top-k and the compressed table and pool, not only the block
    table."""
    rng = ref.fresh_rng()
    c = step_case(rng, invalid=[1])
    specs, _ = layers_and_pools(rng)
    given = []

    def inputs(layer):
        s = c["step"]
        step = dataclasses.replace(s, seq_lens=s.seq_lens.copy(),
                                   cum_seq_lens_q=s.cum_seq_lens_q.copy(),
                                   is_valid_token=s.is_valid_token.copy())
        fresh = dict(c, step=step, block_table=c["block_table"].copy(), topk=c["topk"].copy(),
                     comp_table=c["comp_table"].copy(), comp_view=c["comp_view"].copy(),
                     swa_view=c["swa_view"].copy())
        args = index_args(fresh, specs[layer].compress_ratio)
        arrays = [step.seq_lens, step.cum_seq_lens_q, step.is_valid_token,
                  args.swa.block_table, args.swa.swa_kv_cache]
        if specs[layer].compress_ratio:
            arrays += [args.compressed.topk_indices, args.compressed.block_table,
                       args.compressed.compressed_kv_cache]
        given.extend(weakref.ref(a) for a in arrays)
        return args

    tables = smla.SparseIndexTables(specs, "cpu")
    for spec in specs:
        tables.lookup(spec.layer, inputs)
    gc.collect()
    assert len(given) == 2 * 5 + 2 * 8
    assert all(alive() is not None for alive in given)
    tables.reset()
    gc.collect()
    assert all(alive() is None for alive in given)


def test_step_inputs_may_be_read_only():
    """A step's tables, top-k and block tables are only read: read-only arrays give the same
    outputs, bit for bit, with the top-k read by the decodes and from built tables."""
    specs, layers, inputs, queries = _executor_case(ref.fresh_rng())

    def read_only(a):
        a = a.copy()
        a.flags.writeable = False
        return a

    frozen = smla.StepInputs(
        metadata=inputs.metadata, block_tables=[read_only(t) for t in inputs.block_tables],
        compressed_block_tables={2: read_only(inputs.compressed_block_tables[2])},
        topk_indices={2: read_only(inputs.topk_indices[2])})
    for mode in ("topk", "table"):
        outs = []
        for step in (inputs, frozen):
            executor = smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12,
                                         compressed_index=mode)
            outs.append([np.full((4, 4, D), np.nan, np.float32).astype(BF16) for _ in specs])
            executor.run_step(step, queries, outs[-1])
        for a, b in zip(*outs):
            assert np.isfinite(a.astype(np.float32)).all()
            assert (a.view(np.uint16) == b.view(np.uint16)).all(), mode


def test_step_executor_holds_every_array_of_its_layers_and_step():
    """The executor holds every layer array (pools and sinks) for its life, and every array of
    a step's inputs (metadata, block tables, top-k, compressed block tables) until the next step
    begins, though the caller keeps none: runs read them after the Python objects that named
    them are gone (on a GPU, a fork reads the inputs later still); they give the same bits."""
    rng = ref.fresh_rng()
    c = step_case(rng, invalid=[1])
    specs, pools = layers_and_pools(rng)
    sinks = rng.standard_normal(4).astype(np.float32)
    queries = [rng.standard_normal((4, 4, D)).astype(BF16) for _ in specs]
    other_table = rng.permutation(40)[:16].reshape(4, 4).astype(np.int32)  # group 1's

    def make(fresh):
        copy = (lambda a: a.copy()) if fresh else (lambda a: a)
        swa = [copy(p[0].base)[:, :64] for p in pools]
        comp, held_sinks = copy(c["comp_view"].base)[:, :16], copy(sinks)
        layers = [smla.AttentionLayer(spec=s, swa_kv_cache=swa[i], bmm1_scale=D**-0.5,
                                      compressed_kv_cache=comp if s.compress_ratio else None,
                                      sinks=held_sinks)
                  for i, s in enumerate(specs)]
        return (smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12),
                [weakref.ref(a) for a in [comp.base, held_sinks] + [v.base for v in swa]])

    def step_inputs(fresh):
        copy = (lambda a: a.copy()) if fresh else (lambda a: a)
        s = c["step"]
        metadata = dataclasses.replace(s, seq_lens=copy(s.seq_lens),
                                       cum_seq_lens_q=copy(s.cum_seq_lens_q),
                                       is_valid_token=copy(s.is_valid_token))
        inputs = smla.StepInputs(metadata=metadata,
                                 block_tables=[copy(c["block_table"]), copy(other_table)],
                                 compressed_block_tables={2: copy(c["comp_table"])},
                                 topk_indices={2: copy(c["topk"])})
        arrays = [metadata.seq_lens, metadata.cum_seq_lens_q, metadata.is_valid_token,
                  *inputs.block_tables, inputs.compressed_block_tables[2], inputs.topk_indices[2]]
        return inputs, [weakref.ref(a) for a in arrays]

    def run(executor, inputs):
        outs = [np.full((4, 4, D), np.nan, np.float32).astype(BF16) for _ in specs]
        executor.begin_step(inputs)
        del inputs
        gc.collect()
        for spec, q, o in zip(specs, queries, outs):
            executor.run_layer(spec.layer, q, o)
        executor.end_step()
        return outs

    plain, _ = make(False)
    expected = run(plain, step_inputs(False)[0])
    assert all(np.isfinite(e.astype(np.float32)).all() for e in expected)  # outs NaN-poisoned
    executor, layer_arrays = make(True)
    gc.collect()
    assert all(alive() is not None for alive in layer_arrays)
    inputs, input_arrays = step_inputs(True)
    outs = run(executor, inputs)
    del inputs
    gc.collect()
    for got, want in zip(outs, expected):
        assert (got.view(np.uint16) == want.view(np.uint16)).all()
    assert all(alive() is not None for alive in input_arrays)
    executor.begin_step(step_inputs(True)[0])  # the previous step's inputs go
    gc.collect()
    assert all(alive() is None for alive in input_arrays)
    assert all(alive() is not None for alive in layer_arrays)
    # A refused run_step keeps the open step's inputs, which its layers still read.
    inputs, input_arrays = step_inputs(True)
    executor.begin_step(inputs)
    del inputs
    with pytest.raises(ValueError, match="one query and one out per layer"):
        executor.run_step(step_inputs(True)[0], queries[:1], [np.zeros((4, 4, D), BF16)])
    gc.collect()
    assert all(alive() is not None for alive in input_arrays)
    outs = [np.full((4, 4, D), np.nan, np.float32).astype(BF16) for _ in specs]
    for spec, q, o in zip(specs, queries, outs):
        executor.run_layer(spec.layer, q, o)
    executor.end_step()
    for got, want in zip(outs, expected):
        assert (got.view(np.uint16) == want.view(np.uint16)).all()
    # A step that fails past its start (its last layer's out has too few heads) holds its
    # inputs, which its earlier layers' work read.
    inputs, input_arrays = step_inputs(True)
    outs = [np.zeros((4, 4, D), BF16) for _ in specs[:-1]] + [np.zeros((4, 2, D), BF16)]
    with pytest.raises(ValueError, match="smla: out"):
        executor.run_step(inputs, queries, outs)
    del inputs
    gc.collect()
    assert all(alive() is not None for alive in input_arrays)
    # A second such step holds its own inputs alone: the first one's go (its work was joined as
    # the second began), not every failed step's, one inside the other.
    second, second_arrays = step_inputs(True)
    with pytest.raises(ValueError, match="smla: out"):
        executor.run_step(second, queries, outs)
    del second
    gc.collect()
    assert all(alive() is None for alive in input_arrays)
    assert all(alive() is not None for alive in second_arrays)
    del executor
    gc.collect()
    assert all(alive() is None for alive in layer_arrays)


def test_layer_spec_defaults_are_the_libraries():
    """A LayerSpec's defaults are smla::LayerSpec's: no kv or index source, every compressed
    entry (index_topk 0), window W; they pick the table key."""
    spec = smla.LayerSpec()
    assert repr(spec) == ("LayerSpec(layer=0, swa_group=0, compress_ratio=0, kv_source=-1, "
                          "index_source=-1, index_topk=0, num_heads=0, window=128, mtp=False)")
    compressed = smla.LayerSpec(layer=3, compress_ratio=4, index_source=3, num_heads=4)
    assert smla.sparse_index_key(compressed) == "-1:3:4"


def test_dlpack_vector_and_wide_bfloat_types_are_refused():
    """A native dtype in two lanes is no element of it; a 32-bit bfloat is no bf16, nor a
    32-bit float8_e4m3fn an fp8."""
    args, _ = make_case(ref.fresh_rng())
    for sinks, got in ((DlpackExport(args["sinks"], CPU, FLOAT, lanes=2), "float32x2"),
                       (DlpackExport(args["sinks"], CPU, BFLOAT), "bfloat32"),
                       (DlpackExport(args["sinks"], CPU, FLOAT8_E4M3FN), "DLPack type code 10/32")):
        with pytest.raises(TypeError, match=f"^smla: sinks: expected .*, got {got}$"):
            smla.sparse_mla_decode(**dict(args, sinks=sinks))


def test_strides_dlpack_cannot_carry_are_named():
    """NumPy strides that are not a multiple of the element size do not cross DLPack: the error
    says so (its exporter's reason), not only that an array was expected."""
    args, _ = make_case(ref.fresh_rng())
    B = len(args["seq_lens"])
    packed = np.zeros(B, dtype=[("a", "<i4"), ("b", "u1")])  # 5-byte strides
    packed["a"] = args["seq_lens"]
    with pytest.raises(TypeError, match="smla: seq_lens: expected an array .*, got ndarray of "
                       r"dtype int32 \(its __dlpack__: .*multiple of itemsize"):
        smla.sparse_mla_decode(**dict(args, seq_lens=packed["a"]))


def test_engine_call_names_a_4d_query_it_cannot_merge():
    """A [B, q, H, D] query from a producer with no strides attribute (DLPack alone, as JAX's
    arrays) has no view whose dims merge: refused by name ([T, H, D] crosses)."""
    args, pools = make_case(ref.fresh_rng(), q_lens=(2, 2), seq_lens=(2, 260))
    common = {name: args[name] for name in (
        "swa_kv_cache", "compressed_kv_cache", "sparse_indices", "sparse_topk_lens", "seq_lens",
        "bmm1_scale", "sinks")}

    class Producer(DlpackExport):
        shape = property(lambda self: self.array.shape)
        ndim = property(lambda self: self.array.ndim)

    bits = args["query"].view(np.uint16)
    with pytest.raises(ValueError, match=r"^smla: query: expected \[T, \.\.\.\], or \[B, q, "
                       r"\.\.\.\] from PyTorch, CuPy or NumPy, got a 4-D Producer$"):
        trtllm_batch_decode_sparse_mla_dsv4(
            query=Producer(bits.reshape(2, 2, 8, D), CPU, BFLOAT), **common, out=args["out"])
    expected_out, _ = reference(args, pools)
    poison_unread(args, pools)
    trtllm_batch_decode_sparse_mla_dsv4(query=Producer(bits, CPU, BFLOAT), **common,
                                        out=args["out"], cum_seq_lens_q=args["cum_seq_lens_q"],
                                        max_q_len=2)
    ref.assert_out_close(args["out"], expected_out, ref.CPU_TOL)


def test_engine_call_merges_arrays_of_any_numpy_dtype():
    """The [B, q, ...] arrays the engine call merges are NumPy views of any dtype, those
    as_strided cannot rebuild from their type string too (ml_dtypes' float8_e5m2 says '<f1'):
    such a query or index array is refused by the op's TypeError naming it, where NumPy's
    unnamed "data type '<f1' not understood" had escaped (a fuzzer's finding)."""
    args, _ = make_case(ref.fresh_rng(), q_lens=(1, 1, 1))
    common = {name: args[name] for name in (
        "query", "swa_kv_cache", "compressed_kv_cache", "sparse_indices", "sparse_topk_lens",
        "seq_lens", "bmm1_scale", "sinks", "out")}
    e5m2 = ml_dtypes.float8_e5m2
    for name, array, takes in (
            ("query", args["query"].astype(e5m2)[:, None], "bf16 or f8e4m3 (float8_e4m3fn)"),
            ("sparse_indices", args["sparse_indices"].view(e5m2)[:, None], "i32"),
            ("out", np.zeros(args["out"].shape, e5m2)[:, None], "bf16")):
        with pytest.raises(TypeError, match=f"^smla: {name}: expected .*float8_e5m2") as info:
            trtllm_batch_decode_sparse_mla_dsv4(**dict(common, **{name: array}))
        assert info.value.argument == name
        # DLPack has no float8_e5m2: the message still names the dtypes the argument takes.
        assert f" of {takes} elements" in info.value.expected, info.value.expected


def test_defaults_of_max_q_len_and_with_mtp():
    """max_q_len defaults to 1 (a request of more tokens then names it); model_layers leaves the
    MTP layer out unless asked."""
    args, _ = make_case(ref.fresh_rng(), q_lens=(2, 1), seq_lens=(5, 260))
    without = {k: v for k, v in args.items() if k != "max_q_len"}
    with pytest.raises(ValueError, match="smla: max_q_len: expected >= every q_len .*, got 1$"):
        smla.sparse_mla_decode(**without)
    c = step_case(ref.fresh_rng())
    s = c["step"]
    assert s.max_q_len > 1
    step = smla.StepMetadata(num_tokens=s.num_tokens, seq_lens=s.seq_lens,
                             cum_seq_lens_q=s.cum_seq_lens_q, num_decodes=s.num_decodes)
    assert step.max_q_len == 1
    flash = smla.model_preset("v4-flash")
    assert len(smla.model_layers(flash, 1)) == flash.num_layers
    assert len(smla.model_layers(flash, 1, with_mtp=True)) == flash.num_layers + 1


def test_counts_past_int32_reach_the_library_checks():
    """Counts the library takes as int64 cross at 2^31: its own range check names them (a
    Python-side int32 bound would say "an int32 value"); past int64 the binding refuses."""
    for call, argument, expected in (
            (lambda n: smla.workspace_bytes(4, 8, n, device="cpu"), "max_columns",
             "0..2^31 - 1"),
            (lambda n: smla.kv_counter_bytes(n, 8), "max_tokens", "0..2^31 - 1"),
            (lambda n: smla.sparse_index_columns(W, n, 0), "top_k", "0..2^31 - 1")):
        with pytest.raises(ValueError, match=f"^smla: {argument}: expected "
                           f"{re.escape(expected)}, got 2147483648$"):
            call(2**31)
        with pytest.raises(ValueError, match=f"^smla: {argument}: expected an int64 value"):
            call(2**63)
    rng = ref.fresh_rng()
    specs, pools = layers_and_pools(rng)
    layer = smla.AttentionLayer(spec=specs[0], swa_kv_cache=pools[0][0], bmm1_scale=D**-0.5)
    for argument in ("max_tokens", "max_columns"):
        sizes = {"max_tokens": 8, "max_columns": W, argument: 2**31}
        with pytest.raises(ValueError, match=f"^smla: {argument}: expected 0\\.\\.2\\^31 - 1, "
                           "got 2147483648$"):
            smla.StepExecutor([layer], **sizes)
    c = step_case(rng)
    s = c["step"]
    a = index_args(c, 4)
    a.step = dataclasses.replace(s, num_decodes=2**31)
    a.out = smla.SparseIndexTable(np.zeros((4, W + 12), np.int32), np.zeros(4, np.int32))
    with pytest.raises(ValueError, match=r"^smla: num_decodes: expected 0\.\.B = 3, "
                       "got 2147483648$"):
        smla.build_sparse_indices(a)
    topk = smla.TopkColumns(c["topk"], c["comp_table"], compress_ratio=4, num_decodes=2**31)
    with pytest.raises(ValueError, match=r"^smla: topk_columns\.num_decodes: expected 0\.\.B = 3, "
                       "got 2147483648$"):
        smla.sparse_mla_decode(
            query=np.zeros((4, 4, D), np.float32).astype(BF16), swa_kv_cache=c["swa_view"],
            compressed_kv_cache=c["comp_view"], seq_lens=s.seq_lens,
            cum_seq_lens_q=s.cum_seq_lens_q, max_q_len=s.max_q_len, bmm1_scale=D**-0.5,
            sparse_indices=np.zeros((4, W), np.int32), sparse_topk_lens=None,
            out=np.zeros((4, 4, D), np.float32).astype(BF16), topk_columns=topk)


def test_streams_up_to_2_64_are_handles():
    """A stream handle is any uint64 (the CPU ignores it): 2^63 and 2^64 - 1 are taken."""
    args, _ = make_case(ref.fresh_rng())
    for stream in (2**63, 2**64 - 1):
        smla.sparse_mla_decode(**args, stream=stream)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="PyTorch is installed")
def test_buffers_without_torch_name_the_function():
    """The buffers are torch tensors: without PyTorch each call raises an ImportError in smla's
    form, naming itself, not a bare ModuleNotFoundError."""
    raises_named(ImportError, "kv_counter_buffer", lambda: smla.kv_counter_buffer(4))
    raises_named(ImportError, "workspace_buffer", lambda: smla.workspace_buffer(4, 64, 640))


# ---------------------------------------------------------------------------------------------
# Bare DLPack capsules: read once only, so each call must import each argument once
# ---------------------------------------------------------------------------------------------

def test_build_sparse_indices_takes_a_capsule_seq_lens():
    """A bare DLPack capsule is an array like any other, but one import uses it up: the call
    finds its device from the seq_lens it imported for the build, not by importing it again
    (which refused the capsule it had just taken: "got PyCapsule")."""
    c = step_case(ref.fresh_rng(), invalid=[2])
    args = index_args(c, 4)
    args.step = dataclasses.replace(args.step, seq_lens=args.step.seq_lens.__dlpack__())
    k = smla.sparse_index_columns(W, c["topk"].shape[1])
    args.out = smla.SparseIndexTable(np.full((4, k), 12345, np.int32), np.full(4, -9, np.int32))
    smla.build_sparse_indices(args)
    indices, lens = expected_table(c, 4)
    np.testing.assert_array_equal(args.out.sparse_indices, indices)
    np.testing.assert_array_equal(args.out.sparse_topk_lens, lens)


def test_step_executor_takes_a_capsule_pool_for_its_first_layer():
    """The first layer's pool gives the executor its device: it is imported once, as every
    other layer's is (a second import refused a capsule pool: "got PyCapsule")."""
    specs, layers, inputs, queries = _executor_case(ref.fresh_rng())
    want = [np.full((4, 4, D), np.nan, np.float32).astype(BF16) for _ in specs]
    smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12).run_step(inputs, queries, want)
    pool = layers[0].swa_kv_cache
    layers[0].swa_kv_cache = smla.with_dtype(pool.view(np.uint16).__dlpack__(), "bf16")
    got = [np.full_like(o, np.nan) for o in want]
    smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12).run_step(inputs, queries, got)
    for a, b in zip(want, got):
        assert (a.view(np.uint16) == b.view(np.uint16)).all()


class _ShapelessExport:
    """A DLPack producer that states no shape (only __dlpack__ and __dlpack_device__)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_engine_call_4d_query_takes_seq_lens_that_state_no_shape():
    """With a [B, q, H, D] query and no cum_seq_lens_q, seq_lens of the right [B] from a DLPack
    producer without .shape, or a bare capsule, run as the array does; they were refused as
    "got []" (the shape of what has none), and the offsets were made from seq_lens' .shape."""
    args, pools = make_case(ref.fresh_rng(), q_lens=(3, 3), seq_lens=(3, 260))
    expected_out, _ = reference(args, pools)
    query = args["query"].reshape(2, 3, 8, D)
    for seq_lens in (_ShapelessExport(args["seq_lens"]), args["seq_lens"].__dlpack__()):
        out = np.full((2, 3, 8, D), np.nan, np.float32).astype(BF16)
        trtllm_batch_decode_sparse_mla_dsv4(
            query=query, swa_kv_cache=args["swa_kv_cache"],
            compressed_kv_cache=args["compressed_kv_cache"], sparse_indices=args["sparse_indices"],
            sparse_topk_lens=args["sparse_topk_lens"], seq_lens=seq_lens, out=out,
            bmm1_scale=args["bmm1_scale"], sinks=args["sinks"])
        ref.assert_out_close(out.reshape(6, 8, D), expected_out, ref.CPU_TOL)
    with pytest.raises(ValueError) as info:  # one of another B is named as an array's is
        trtllm_batch_decode_sparse_mla_dsv4(
            query=query, swa_kv_cache=args["swa_kv_cache"],
            compressed_kv_cache=args["compressed_kv_cache"], sparse_indices=args["sparse_indices"],
            sparse_topk_lens=args["sparse_topk_lens"],
            seq_lens=_ShapelessExport(args["seq_lens"][:1]), bmm1_scale=args["bmm1_scale"])
    assert str(info.value) == ("smla: seq_lens: expected [B = 2] (the B of query "
                               "[2, 3, 8, 512], cum_seq_lens_q absent), got [1]")


def test_refusals_name_the_argument_whatever_text_the_array_gives():
    """A refused array's description quotes its dtype and its __dlpack__'s error: text with a
    character UTF-8 cannot hold (a lone surrogate, as os.fsdecode keeps undecodable bytes) is
    escaped, where it raised RuntimeError("basic_string: construction from null is not
    valid"), which names no argument; a dtype whose str() raises is "?"."""
    class Surrogate:
        dtype = "odd\udc80"

    class Refusing:
        def __dlpack__(self, **kwargs):
            raise BufferError("cannot export \udc80")

    class Raising:
        @property
        def dtype(self):
            return self

        def __str__(self):
            raise RuntimeError("no str")

    for array, got in ((Surrogate(), r"of dtype odd\udc80"),
                       (Refusing(), r"(its __dlpack__: cannot export \udc80)"),
                       (Raising(), "of dtype ?")):
        with pytest.raises(TypeError) as info:
            smla.sparse_mla_decode(**dict(make_case(ref.fresh_rng())[0], query=array))
        assert info.value.argument == "query"
        assert info.value.got.endswith(got), info.value.got


def test_engine_call_max_q_len_from_offsets_the_op_refuses_names_the_offsets():
    """max_q_len=None read from offsets whose steps no int32 holds (uint32 bits read as i32 by
    with_dtype: 2^31 + 5 is negative there) is left to the op, whose check names
    cum_seq_lens_q; it raised ValueError naming max_q_len, which the caller never passed."""
    args, _ = make_case(ref.fresh_rng())
    del args["max_q_len"]
    cum = smla.with_dtype(np.array([0, 2**31 + 5, 5, 6], np.uint32), "i32")
    with pytest.raises(ValueError) as info:
        trtllm_batch_decode_sparse_mla_dsv4(**dict(args, cum_seq_lens_q=cum))
    assert info.value.argument == "cum_seq_lens_q", str(info.value)


# ---------------------------------------------------------------------------------------------
# Bounds and defaults a mutation pass found unchecked
# ---------------------------------------------------------------------------------------------

def test_int32_arguments_take_the_lowest_int32():
    """-2^31 is an int32: it reaches the library, whose range check names it (">= 1"); only
    one below is the Python-side "an int32 value" (a bound one too high refused -2^31 so)."""
    args, _ = make_case(ref.fresh_rng())
    for name in ("window", "max_q_len"):
        with pytest.raises(ValueError) as info:
            smla.sparse_mla_decode(**bad(args, **{name: -2**31}))
        assert (info.value.argument, info.value.expected, info.value.got) == \
            (name, ">= 1", "-2147483648")
        with pytest.raises(ValueError) as info:
            smla.sparse_mla_decode(**bad(args, **{name: -2**31 - 1}))
        assert (info.value.argument, info.value.expected) == (name, "an int32 value")


def test_scales_of_text_or_a_bool_name_what_came():
    """A str, bytes or bool scale (NumPy's bool too) is refused as what it is, not as "an
    ndarray holding" one, which is how an array of them is named."""
    args, _ = make_case(ref.fresh_rng())
    for value, got in (("0.04", "str"), (b"1", "bytes"), (bytearray(b"1"), "bytearray"),
                       (True, "a bool"), (np.True_, "a bool"), (np.bool_(False), "a bool")):
        with pytest.raises(TypeError) as info:
            smla.sparse_mla_decode(**bad(args, bmm1_scale=value))
        assert (info.value.argument, info.value.expected, info.value.got) == \
            ("bmm1_scale", "a float", got)


def test_engine_call_allocates_nothing_for_2_31_tokens():
    """T = 2^31 is the first token count the op refuses (T < 2^31): no out is made for it, as
    none is at 2^40 (one of 128 heads would be 256 TiB: a MemoryError before the op's error)."""
    args, _ = make_case(ref.fresh_rng())
    row = np.zeros((1, smla.MAX_HEADS, D), BF16)
    tokens = np.lib.stride_tricks.as_strided(row, (2**31,) + row.shape[1:], (0,) + row.strides[1:])
    raises_named(NotImplementedError, "query", lambda: trtllm_batch_decode_sparse_mla_dsv4(
        **dict(args, query=tokens, out=None, lse=None)))


def test_engine_call_allocates_out_for_the_most_heads():
    """H = MAX_HEADS is a size the op takes: out=None is made for it as for fewer heads (a
    bound one too low left it None, which the op refused), and holds the op's output."""
    args, _ = make_case(ref.fresh_rng(), heads=smla.MAX_HEADS)
    smla.sparse_mla_decode(**args)
    assert np.isfinite(args["out"].astype(np.float32)).all()
    out = trtllm_batch_decode_sparse_mla_dsv4(**dict(args, out=None, lse=None))
    assert out.shape == args["out"].shape
    assert (out.view(np.uint16) == args["out"].view(np.uint16)).all()


def test_engine_call_merges_one_request_sliced_from_a_wider_buffer():
    """[1, q, ...] arrays whose q tokens are a slice of a wider buffer (dim 0's stride is not q
    times dim 1's) merge into [q, ...] views all the same: one request never steps dim 0. The
    out is written in place, the rest of its buffer left as it was."""
    args, _ = make_case(ref.fresh_rng(), q_lens=(3,), seq_lens=(260,))
    smla.sparse_mla_decode(**args)
    assert np.isfinite(args["out"].astype(np.float32)).all()
    heads, k = args["query"].shape[1], args["sparse_indices"].shape[1]
    query = np.full((1, 5, heads, D), np.nan, np.float32).astype(BF16)
    query[0, :3] = args["query"]
    indices = np.full((1, 5, k), -1, np.int32)
    indices[0, :3] = args["sparse_indices"]
    buffer = np.full((1, 5, heads, D), np.nan, np.float32).astype(BF16)
    out = trtllm_batch_decode_sparse_mla_dsv4(
        query=query[:, :3], swa_kv_cache=args["swa_kv_cache"],
        compressed_kv_cache=args["compressed_kv_cache"], sparse_indices=indices[:, :3],
        sparse_topk_lens=args["sparse_topk_lens"], seq_lens=args["seq_lens"],
        out=buffer[:, :3], bmm1_scale=args["bmm1_scale"], sinks=args["sinks"])
    assert np.shares_memory(out, buffer)
    assert (buffer[0, :3].view(np.uint16) == args["out"].view(np.uint16)).all()
    assert np.isnan(buffer[0, 3:].astype(np.float32)).all()


def test_engine_call_3d_query_leaves_seq_lens_to_the_op():
    """A [T, H, D] query without offsets is one token per request, the op's own default: no
    offsets are made for it, and seq_lens of another length gets the op's error ([B=T]), not
    the one a [B, q, H, D] query's B gets."""
    args, _ = make_case(ref.fresh_rng())
    call = bad(args, cum_seq_lens_q=None, max_q_len=1)
    with pytest.raises(ValueError) as op:
        smla.sparse_mla_decode(**call)
    with pytest.raises(ValueError) as info:
        trtllm_batch_decode_sparse_mla_dsv4(**call)
    assert op.value.argument == "seq_lens"
    assert str(info.value) == str(op.value)


def test_engine_call_leaves_offsets_of_another_b_unread():
    """max_q_len=None with offsets that are not seq_lens' B + 1 leaves them to the op's check,
    unread: diffing a broadcast view of 2^40 of them a chunk at a time takes minutes, so the
    alarm (20 s, where an unread call returns at once) fails the test rather than let it hang."""
    import signal

    def read_too_long(*_):
        raise TimeoutError("offsets of another B were read")

    args, _ = make_case(ref.fresh_rng())
    zeros = np.zeros(1, np.int32)
    cum = np.lib.stride_tricks.as_strided(zeros, (2**40,), (0,))
    previous = signal.signal(signal.SIGALRM, read_too_long)
    signal.setitimer(signal.ITIMER_REAL, 20)
    try:
        raises_named(ValueError, "cum_seq_lens_q", lambda: trtllm_batch_decode_sparse_mla_dsv4(
            **dict(args, max_q_len=None, cum_seq_lens_q=cum)))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_engine_call_max_q_len_counts_a_step_across_chunks(monkeypatch):
    """max_q_len=None is the largest step of the offsets, read a chunk at a time: a step from
    one chunk's last offset to the next chunk's first counts too. Chunks of 2 here (2^20 in
    use: a million requests to cross one)."""
    monkeypatch.setattr(smla.engine, "_CHUNK", 2)
    args, _ = make_case(ref.fresh_rng(), q_lens=(1, 3, 1, 1), seq_lens=(5, 300, 140, 20))
    smla.sparse_mla_decode(**args)  # max_q_len 3: the step from offset 1 to 2
    out = trtllm_batch_decode_sparse_mla_dsv4(**dict(args, max_q_len=None,
                                                     out=np.full_like(args["out"], np.nan)))
    assert (out.view(np.uint16) == args["out"].view(np.uint16)).all()


def test_engine_call_errors_keep_the_op_text_after_the_merged_shape():
    """An error about a merged [B, q, ...] array gets the shape passed in place of the merged
    one, and keeps what the op said after it (here why the out is refused: its strides), with
    no chained cause, whose text would show the op's shapes and names again."""
    args, _ = make_case(ref.fresh_rng(), q_lens=(3, 3), seq_lens=(3, 260))
    heads_overlap = np.lib.stride_tricks.as_strided(  # every head of a token on one row
        np.zeros((6, 8, D), BF16), (2, 3, 8, D), (3 * 8 * D * 2, 8 * D * 2, 0, 2))
    with pytest.raises(ValueError) as info:
        trtllm_batch_decode_sparse_mla_dsv4(**dict(
            args, query=args["query"].reshape(2, 3, 8, D), out=heads_overlap,
            cum_seq_lens_q=None, max_q_len=None, lse=None))
    assert (info.value.argument, info.value.got) == (
        "out", "[2, 3, 8, 512] (its first two dims merged: [6, 8, 512]) with strides "
               "[4096, 0, 1]")
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_num_heads_is_bounded_as_an_int32():
    """num_heads is an int32 in the library: 2^31 is refused naming it, not by nanobind's
    TypeError that names no argument (a 64-bit bound let it through to the binding)."""
    for call in (lambda n: smla.kv_counter_bytes(8, n),
                 lambda n: smla.workspace_bytes(8, n, 640, "cpu")):
        with pytest.raises(ValueError, match=r"^smla: num_heads: expected an int32 value, "
                           "got 2147483648$"):
            call(2**31)


def test_decode_takes_read_only_inputs():
    """Every array the op only reads may be read-only (a pool or table mapped or shared so):
    the op's output bit for bit; only out, lse, workspace and kv_counters are written."""
    args, _ = make_case(ref.fresh_rng())
    smla.sparse_mla_decode(**args)
    want_out, want_lse = args["out"].copy(), args["lse"].copy()
    inputs = ("query", "swa_kv_cache", "compressed_kv_cache", "sparse_indices",
              "sparse_topk_lens", "seq_lens", "cum_seq_lens_q", "sinks")
    got = dict(args, **{name: read_only(args[name]) for name in inputs},
               out=np.full_like(want_out, np.nan), lse=np.full_like(want_lse, np.nan))
    smla.sparse_mla_decode(**got)
    assert (got["out"].view(np.uint16) == want_out.view(np.uint16)).all()
    assert (got["lse"].view(np.uint32) == want_lse.view(np.uint32)).all()


def test_step_executor_names_a_missing_query_or_out():
    """run_layer with no query or no out names it (nanobind's TypeError names no argument);
    the step stays begun and the layer runs after."""
    rng = ref.fresh_rng()
    specs, layers, inputs, queries = _executor_case(rng)
    executor = smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12)
    executor.begin_step(inputs)
    out = np.full((4, 4, D), np.nan, np.float32).astype(BF16)
    raises_named(ValueError, "query", lambda: executor.run_layer(0, None, out))
    raises_named(ValueError, "out", lambda: executor.run_layer(0, queries[0], None))
    executor.run_layer(0, queries[0], out)
    executor.end_step()
    assert np.isfinite(out.astype(np.float32)).all()


def test_attention_layer_bmm2_scale_defaults_to_one():
    """A layer given no bmm2_scale (a bf16 cache's) runs at 1.0, the op's default: the bits of
    the layers given 1.0, and not those of 0.5 (so the scale is seen)."""
    specs, layers, inputs, queries = _executor_case(ref.fresh_rng())
    outs = {}
    for scale in (None, 1.0, 0.5):
        given = layers if scale is None else [dataclasses.replace(l, bmm2_scale=scale)
                                               for l in layers]
        outs[scale] = [np.full((4, 4, D), np.nan, np.float32).astype(BF16) for _ in specs]
        smla.StepExecutor(given, max_tokens=8, max_columns=W + 12).run_step(
            inputs, queries, outs[scale])
    for default, one, half in zip(outs[None], outs[1.0], outs[0.5]):
        assert np.isfinite(default.astype(np.float32)).all()
        assert (default.view(np.uint16) == one.view(np.uint16)).all()
        assert (default.view(np.uint16) != half.view(np.uint16)).any()


def test_every_public_name_has_a_docstring():
    """help() states each public name's contract: a docstring of its own, not a bare signature
    (nanobind's, a dataclass's) nor one inherited (an enum's)."""
    def documented(obj, name):
        doc = obj.__doc__ or ""
        signature = re.compile(rf"{re.escape(name)}\(.*\)( -> .*)?$")
        return any(line.strip() and not signature.match(line) for line in doc.splitlines())

    missing = []
    for name in smla.__all__:
        obj = getattr(smla, name)
        if isinstance(obj, (bool, int)):  # the constants
            continue
        if not documented(obj, name):
            missing.append(name)
        if name in ("SparseIndexTables", "StepExecutor"):
            for member, value in vars(obj).items():
                if not member.startswith("_") and not documented(value, member):
                    missing.append(f"{name}.{member}")
    assert not missing, missing
