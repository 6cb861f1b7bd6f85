"""The smla package on CUDA with PyTorch tensors, against a float64 PyTorch reference written
here (SPEC §2), plus capture and replay under torch.cuda.graph (replay equals eager bitwise).
Skipped without torch or a CUDA device, or when this build of smla has no CUDA backend; with
SMLA_REQUIRE_GPU=1 (scripts/gpu_check.sh) a missing one fails instead."""

import itertools
import math
import os

import pytest

_REQUIRED = os.environ.get("SMLA_REQUIRE_GPU") == "1"


def _skip(reason):
    if _REQUIRED:
        pytest.fail(f"SMLA_REQUIRE_GPU=1 and {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


torch = pytest.importorskip("torch") if not _REQUIRED else __import__("torch")
if not torch.cuda.is_available():
    _skip("no CUDA device")

import smla  # noqa: E402
from smla.engine import trtllm_batch_decode_sparse_mla_dsv4  # noqa: E402
from np_reference import DEVICE_TOL, assert_out_close, fresh_rng  # noqa: E402
from step_layers import four_layers  # noqa: E402

if not smla.WITH_CUDA:
    _skip("smla was built without CUDA")

D, W = 512, 128
DEV = torch.device("cuda", torch.cuda.current_device())


# ---------------------------------------------------------------------------------------------
# Reference (float64, vectorised)
# ---------------------------------------------------------------------------------------------

def positions(seq_lens, cum, num_tokens):
    """pos(t) = seq_len[b] - q_len[b] + i (SPEC §1)."""
    if cum is None:
        cum = torch.arange(num_tokens + 1, device=seq_lens.device)
    q_lens = (cum[1:] - cum[:-1]).long()
    request = torch.repeat_interleave(torch.arange(len(seq_lens), device=cum.device), q_lens)
    i = torch.arange(num_tokens, device=cum.device) - cum[:-1].long()[request]
    return seq_lens.long()[request] - q_lens[request] + i


def gather(pool64, span, offsets):
    """Rows at storage offsets and whether each is inside the pool (SPEC §2 rule 3)."""
    blocks, block_size = pool64.shape[:2]
    o = offsets.long()
    valid = (o >= 0) & (o < blocks * span) & (o % span < block_size)
    o = torch.where(valid, o, torch.zeros_like(o))
    return pool64[o // span, o % span], valid


def attended(case):
    """[T, K] mask of attended columns, and the gathered float64 rows [T, K, D]."""
    idx, lens = case["sparse_indices"], case["sparse_topk_lens"]
    num_tokens, num_columns = idx.shape
    pos = positions(case["seq_lens"], case["cum_seq_lens_q"], num_tokens)
    col = torch.arange(num_columns, device=idx.device)
    in_window = col < torch.clamp(pos + 1, max=W)[:, None]
    mask = (col < lens[:, None].long()) & ((col >= W) | in_window)
    swa_rows, swa_ok = gather(case["swa64"], case["swa_span"], idx[:, :W])
    comp_rows, comp_ok = gather(case["comp64"], case["comp_span"], idx[:, W:])
    mask &= torch.cat([swa_ok, comp_ok], 1)
    return mask, torch.cat([swa_rows, comp_rows], 1)


def reference(case):
    q = case["query"].double()
    num_tokens, heads, _ = q.shape
    mask, kv = attended(case)
    kv = torch.where(mask[..., None], kv, torch.zeros((), dtype=kv.dtype, device=kv.device))
    s = case["bmm1_scale"] * torch.einsum("thd,tkd->thk", q, kv)
    s = s.masked_fill(~mask[:, None, :], -math.inf)
    # The largest sum of |terms| of a score (masked columns' rows are zeros): lse's bound.
    terms = abs(case["bmm1_scale"]) * torch.einsum("thd,tkd->thk", q.abs(), kv.abs()).amax(-1)
    empty = ~mask.any(1)
    s_max = s.amax(-1)
    safe_max = torch.where(torch.isfinite(s_max), s_max, torch.zeros_like(s_max))
    lse = safe_max + torch.log(torch.exp(s - safe_max[..., None]).sum(-1))
    lse[empty] = -math.inf
    sink = (torch.full((heads,), -math.inf, dtype=torch.float64, device=q.device)
            if case["sinks"] is None else case["sinks"].double())
    m = torch.maximum(s_max, sink[None])
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m[..., None])
    denom = p.sum(-1) + torch.exp(sink[None] - m)
    out = case["bmm2_scale"] * torch.einsum("thk,tkd->thd", p, kv) / denom[..., None]
    out[empty] = 0
    out[:, sink == math.inf] = 0
    full = torch.zeros((num_tokens, case["out"].shape[1], D), dtype=torch.float64, device=q.device)
    full[:, :heads] = out
    return full, lse, terms


def poison_unread(case):
    """NaN into every pool row no attended column points to (SPEC §2)."""
    mask, _ = attended(case)
    for name, span, cols in (("swa_kv_cache", case["swa_span"], slice(0, W)),
                             ("compressed_kv_cache", case["comp_span"], slice(W, None))):
        pool = case[name]
        blocks, block_size = pool.shape[:2]
        o = case["sparse_indices"][:, cols].long()[mask[:, cols]]
        keep = torch.zeros(blocks, block_size, dtype=torch.bool, device=pool.device)
        keep[o // span, o % span] = True
        pool[~keep] = math.nan


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------

def packed_pool(gen, blocks, block_size, span):
    dev = gen.device
    pages = torch.full((blocks, span, D), math.nan, dtype=torch.bfloat16, device=dev)
    pages[:, :block_size] = torch.randn(blocks, block_size, D, generator=gen, device=dev).bfloat16()
    view = pages[:, :block_size]
    return view, view.double()


def offsets(gen, blocks, block_size, span, shape):
    dev = gen.device
    good = (torch.randint(0, blocks, shape, generator=gen, device=dev) * span
            + torch.randint(0, block_size, shape, generator=gen, device=dev))
    kind = torch.rand(shape, generator=gen, device=dev)
    out = torch.where(kind < 0.08, torch.full_like(good, -1), good)
    out = torch.where((kind >= 0.08) & (kind < 0.12), blocks * span + good % 97, out)
    return out.int()


def fresh_seed():
    """A fresh seed, printed (SMLA_TEST_SEED replays it)."""
    return int(fresh_rng().integers(2**62))


def make_case(q_lens, seq_lens, heads, out_heads=None, top_p=512, sinks="finite",
              block_size=64, span=80, device=DEV):
    """A random case on `device` (its tensors, and those the reference makes from them)."""
    gen = torch.Generator(device=device).manual_seed(fresh_seed())
    num_tokens = sum(q_lens)
    swa, swa64 = packed_pool(gen, 64, block_size, span)
    comp, comp64 = packed_pool(gen, 48, block_size, span + 16)
    idx = torch.cat([offsets(gen, 64, block_size, span, (num_tokens, W)),
                     offsets(gen, 48, block_size, span + 16, (num_tokens, top_p))], 1)
    lens = torch.randint(W - 16, W + top_p + 1, (num_tokens,), generator=gen, device=device).int()
    sink_values = {None: None,
                   "-inf": torch.full((heads,), -math.inf, device=device),
                   "+inf": torch.full((heads,), math.inf, device=device),
                   "finite": torch.randn(heads, generator=gen, device=device) * 2,
                   "mixed": torch.tensor([-math.inf, 0.5, math.inf, -3.0],
                                         device=device).repeat(heads)[:heads]}[sinks]
    cum = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=device)
    return dict(
        query=torch.randn(num_tokens, heads, D, generator=gen, device=device).bfloat16(),
        swa_kv_cache=swa, compressed_kv_cache=comp, swa64=swa64, comp64=comp64,
        swa_span=span, comp_span=span + 16, sparse_indices=idx, sparse_topk_lens=lens,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device), cum_seq_lens_q=cum,
        max_q_len=max(q_lens), sinks=sink_values, bmm1_scale=D**-0.5, bmm2_scale=1.0,
        out=torch.full((num_tokens, out_heads or heads, D), math.nan, dtype=torch.bfloat16,
                       device=device),
        lse=torch.full((num_tokens, heads), math.nan, device=device))


OP_ARGS = ("query", "swa_kv_cache", "compressed_kv_cache", "sparse_indices", "sparse_topk_lens",
           "seq_lens", "cum_seq_lens_q", "max_q_len", "sinks", "bmm1_scale", "bmm2_scale", "out",
           "lse")


def op_args(case, **extra):
    return dict({k: case[k] for k in OP_ARGS}, **extra)


def check(case, expected_out, expected_lse, lse_terms):
    out = case["out"].double()
    assert torch.isfinite(out).all(), "NaN or Inf reached the output"
    assert_out_close(out.cpu().numpy(), expected_out.cpu().numpy(), DEVICE_TOL)
    if case["lse"] is not None:  # as tests/oracle.h's device(bf16): 1e-5 x max(1, |lse|) plus
        # 2^-22 of the largest score's |terms| (the sums' rounding), -inf exactly
        got, want = case["lse"].double(), expected_lse
        bound = 1e-5 * torch.clamp(want.abs(), min=1) + 2.0**-22 * lse_terms
        ok = torch.where(torch.isinf(want), got == want, (got - want).abs() <= bound)
        assert ok.all(), f"lse: {int((~ok).sum())} out of bounds"


def buffers(case):
    num_tokens, heads = case["query"].shape[:2]
    dev = case["query"].device
    return dict(kv_counters=smla.kv_counter_buffer(num_tokens, heads, device=dev),
                workspace=smla.workspace_buffer(num_tokens, heads, case["sparse_indices"].shape[1],
                                                device=dev))


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("q_lens,seq_lens,heads,out_heads", [
    ((1, 3, 2), (5, 300, 140), 8, 8),        # varlen, short windows
    ((1,) * 4, (130, 2000, 7, 640), 64, 64),  # few tokens, many columns: split-KV
    ((2,) * 16, (900,) * 16, 128, 128),       # MTP, 128 heads
    ((1, 1), (50, 800), 5, 16),               # padded heads
])
@pytest.mark.parametrize("with_buffers", [False, True])
def test_decode(q_lens, seq_lens, heads, out_heads, with_buffers):
    case = make_case(q_lens, seq_lens, heads, out_heads)
    expected = reference(case)
    poison_unread(case)
    smla.sparse_mla_decode(**op_args(case, **(buffers(case) if with_buffers else {})))
    torch.cuda.synchronize()
    check(case, *expected)


@pytest.mark.parametrize("sinks", [None, "-inf", "finite", "+inf", "mixed"])
def test_decode_sinks(sinks):
    case = make_case((1, 2, 1), (64, 700, 129), 16, sinks=sinks)
    expected = reference(case)
    poison_unread(case)
    smla.sparse_mla_decode(**op_args(case, **buffers(case)))
    torch.cuda.synchronize()
    check(case, *expected)


def busy_side_stream():
    """A case, its expected result for a fresh query, its buffers, and a side stream on which a
    slow kernel and then the fresh query's copy into the case are queued: a call that reads the
    query on any other stream sees the old values."""
    case = make_case((1, 1, 1), (300, 40, 1000), 64)
    fresh = torch.randn_like(case["query"].float()).bfloat16()
    expected = reference(dict(case, query=fresh))
    made = buffers(case)  # before: making them synchronises
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        case["query"].copy_(fresh)
    return case, expected, made, side


class EngineTensor(torch.Tensor):
    """An engine's own tensor type: a torch tensor all the same."""


@pytest.mark.parametrize("form", ["plain", "with_dtype", "subclass"])
def test_decode_runs_on_the_current_stream(form):
    """The launch goes on torch's current stream, not the default one; also with the query's
    bits passed through with_dtype, and for a query of a torch.Tensor subclass."""
    case, expected, made, side = busy_side_stream()
    query = case["query"]
    extra = {"plain": {},
             "with_dtype": {"query": smla.with_dtype(query.view(torch.int16), "bf16")},
             "subclass": {"query": query.as_subclass(EngineTensor)}}[form]
    with torch.cuda.stream(side):
        smla.sparse_mla_decode(**op_args(case, **made, **extra))
    torch.cuda.synchronize()
    check(case, *expected)


@pytest.mark.parametrize("form", ["stream", "handle"])
def test_decode_runs_on_the_stream_given(form):
    """stream= (a torch.cuda.Stream, or its cudaStream_t) is the call's stream though another
    is current, which does not wait for it."""
    case, expected, made, side = busy_side_stream()
    assert torch.cuda.current_stream() != side
    smla.sparse_mla_decode(**op_args(case, **made),
                           stream=side if form == "stream" else side.cuda_stream)
    torch.cuda.synchronize()
    check(case, *expected)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_decode_on_a_device_that_is_not_current():
    """Tensors on another device than the current one: the call runs there, on that device's
    current stream, split (2 x 2 tokens) or not (64 x 2); a stream made on the current device is
    refused by name, and nothing is left for torch's next launch check to find."""
    other = torch.device("cuda", 1 if DEV.index == 0 else 0)
    for q_lens in ((2, 2), (2,) * 64):
        case = make_case(q_lens, (900,) * len(q_lens), 64, device=other)
        expected = reference(case)
        poison_unread(case)
        smla.sparse_mla_decode(**op_args(case, **buffers(case)))
        torch.cuda.synchronize(other)
        check(case, *expected)
    foreign = torch.cuda.Stream(device=DEV)  # not the legacy default (0): that is every device's
    with pytest.raises(ValueError, match=f"smla: stream: .*cuda:{other.index}.*cuda:{DEV.index}"):
        smla.sparse_mla_decode(**op_args(case, stream=foreign))
    assert torch.cuda.current_device() == DEV.index
    torch.ones(4, device=DEV).add_(1)
    torch.cuda.synchronize()


def test_engine_call_capture_and_replay_bitwise():
    case = make_case((1,) * 8, tuple(range(100, 4100, 500)), 64)
    expected = reference(case)
    poison_unread(case)
    num_tokens, heads = case["query"].shape[:2]
    counters = smla.kv_counter_buffer(num_tokens, heads)
    workspace = smla.workspace_buffer(num_tokens, heads, case["sparse_indices"].shape[1])

    def step():
        trtllm_batch_decode_sparse_mla_dsv4(
            query=case["query"], swa_kv_cache=case["swa_kv_cache"],
            compressed_kv_cache=case["compressed_kv_cache"], workspace_buffer=workspace,
            sparse_indices=case["sparse_indices"], sparse_topk_lens=case["sparse_topk_lens"],
            seq_lens=case["seq_lens"], out=case["out"], bmm1_scale=case["bmm1_scale"],
            bmm2_scale=1.0, sinks=case["sinks"], cum_seq_lens_q=None, max_q_len=1,
            multi_ctas_kv_counter_buffer=counters, sparse_indices_are_storage_offsets=True)

    step()
    torch.cuda.synchronize()
    eager = case["out"].clone()
    check(dict(case, lse=None), *expected)  # the engine call writes no lse

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    case["out"].fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(case["out"].view(torch.int16), eager.view(torch.int16))

    # New values in the captured buffers: replay equals an eager run on them.
    case["query"].copy_(torch.randn_like(case["query"].float()).bfloat16())
    step()
    torch.cuda.synchronize()
    eager = case["out"].clone()
    for _ in range(3):  # counters must come back to zero after every replay
        case["out"].fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(case["out"].view(torch.int16), eager.view(torch.int16))


def test_errors_name_the_argument():
    case = make_case((1, 1), (10, 20), 8)
    with pytest.raises(TypeError, match="smla: seq_lens:"):
        smla.sparse_mla_decode(**op_args(case, seq_lens=case["seq_lens"].cpu()))
    with pytest.raises(TypeError, match="smla: query:"):
        smla.sparse_mla_decode(**op_args(case, query=case["query"].half()))
    with pytest.raises(ValueError, match="smla: out:"):
        smla.sparse_mla_decode(**op_args(case, out=case["out"][:, :4]))
    with pytest.raises(TypeError, match="smla: bmm1_scale:"):
        smla.sparse_mla_decode(**op_args(case, bmm1_scale=torch.tensor(0.04, device=DEV)))


def test_kv_counter_buffer_is_cached_and_grown_only():
    a = smla.kv_counter_buffer(64, 64)
    assert a.device.type == "cuda" and a.dtype == torch.uint8 and not a.any()
    assert smla.kv_counter_buffer(16, 64) is a
    b = smla.kv_counter_buffer(4096, 128)  # more than any test before: made at this size
    assert b.numel() >= a.numel() and not b.any()
    assert smla.kv_counter_buffer(4096, 128) is b  # the same size again: no new buffer
    assert smla.kv_counter_buffer(64, 64) is b


def test_buffers_grown_by_threads_at_once_all_stay_alive():
    """Threads growing one buffer at once (to sizes no earlier test asked for): the one kept
    is the largest a thread was given, and every buffer a thread was given is still held (a
    graph captured with one keeps only its address)."""
    import threading
    from smla import buffers as held
    given, sizes = [], [(8192 + 97 * i, 128) for i in range(16)]
    threads = [threading.Thread(target=lambda s=s: given.append(smla.kv_counter_buffer(*s)))
               for s in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alive = {b.data_ptr() for b in [*held._buffers.values(), *held._retired]}
    assert all(b.data_ptr() in alive for b in given)
    assert smla.kv_counter_buffer(*sizes[-1]) is max(given, key=lambda b: b.numel())


def test_kv_counter_bytes_takes_tokens_then_heads():
    """kv_counter_bytes(max_tokens, num_heads) is the library's for those arguments in that
    order (counters go per token and head block: 8 tokens of 128 heads and 128 tokens of 8
    heads need different sizes)."""
    assert smla.kv_counter_bytes(8, 128) == smla._smla.kv_counter_bytes(8, 128)
    assert smla.kv_counter_bytes(128, 8) == smla._smla.kv_counter_bytes(128, 8)
    assert 0 < smla.kv_counter_bytes(8, 128) != smla.kv_counter_bytes(128, 8)


def test_step_executor_on_cuda_matches_cpu_and_replays():
    """The executor on CUDA (tables built on the GPU) equals the CPU executor's result within
    bf16 tolerance and, on SPEC §5's compressed tables, its own bits; a captured step replays
    bitwise."""
    np = pytest.importorskip("numpy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    gen = torch.Generator(device=DEV).manual_seed(fresh_seed())
    heads, q_lens, seq_lens = 16, (1, 2, 1), (5, 200, 131)
    num_tokens = sum(q_lens)
    specs = four_layers(heads)
    pools = [packed_pool(gen, 40, 64, 80)[0] for _ in specs]
    comp = packed_pool(gen, 30, 16, 20)[0]
    tables = [torch.randperm(40, generator=gen, device=DEV)[:16].view(4, 4).int() for _ in range(2)]
    comp_table = torch.randperm(30, generator=gen, device=DEV)[:16].view(4, 4).int()
    topk = torch.full((num_tokens, 12), -1, dtype=torch.int32, device=DEV)
    topk[:, :3] = torch.arange(3, device=DEV)
    topk[0, :] = -1  # request 0 has seq_len 5: one compressed entry at most
    topk[0, 0] = 0
    cum = torch.tensor([0, 1, 3, 4], dtype=torch.int32, device=DEV)
    sinks = torch.randn(heads, generator=gen, device=DEV)
    queries = [torch.randn(num_tokens, heads, D, generator=gen, device=DEV).bfloat16()
               for _ in specs]

    def layers_on(to):
        return [smla.AttentionLayer(spec=s, swa_kv_cache=to(pools[i]), bmm1_scale=D**-0.5,
                                    compressed_kv_cache=to(comp) if s.compress_ratio else None,
                                    sinks=to(sinks)) for i, s in enumerate(specs)]

    def run(device_of, compressed_index="auto"):
        to = (lambda t: t) if device_of == "cuda" else (lambda t: _numpy(t, np, ml_dtypes))
        layers = layers_on(to)
        inputs = smla.StepInputs(
            metadata=smla.StepMetadata(num_tokens=num_tokens,
                                       seq_lens=to(torch.tensor(seq_lens, dtype=torch.int32,
                                                                device=DEV)),
                                       cum_seq_lens_q=to(cum), num_decodes=3, max_q_len=2),
            block_tables=[to(t) for t in tables], compressed_block_tables={2: to(comp_table)},
            topk_indices={2: to(topk)})
        qs = [to(q) for q in queries]
        outs = [to(torch.full((num_tokens, heads, D), math.nan, dtype=torch.bfloat16,
                              device=DEV)) for _ in specs]
        return (smla.StepExecutor(layers, max_tokens=8, max_columns=W + 12,
                                  compressed_index=compressed_index), inputs, qs, outs)

    cpu_exec, cpu_inputs, cpu_q, cpu_out = run("cpu")
    cpu_exec.run_step(cpu_inputs, cpu_q, cpu_out)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        executor, inputs, qs, outs = run("cuda")
        executor.run_step(inputs, qs, outs)  # eager first: its memory serves the capture
    torch.cuda.synchronize()
    for got, want in zip(outs, cpu_out):  # the CPU's bf16 output as the reference
        assert_out_close(got.double().cpu().numpy(), want.astype(np.float64), DEVICE_TOL)
    eager = [o.clone() for o in outs]
    with torch.cuda.stream(stream):  # SPEC §5's compressed tables: the same bits
        table_exec, _, _, table_outs = run("cuda", "table")
        table_exec.run_step(inputs, qs, table_outs)
    torch.cuda.synchronize()
    for got, want in zip(table_outs, eager):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        executor.run_step(inputs, qs, outs)
        # An executor made inside the capture is refused; the capture goes on.
        with pytest.raises(NotImplementedError, match="smla: stream: .*not capturing"):
            smla.StepExecutor(layers_on(lambda t: t), max_tokens=8, max_columns=W + 12)
    for o in outs:
        o.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outs, eager):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def quantize_rows(gen, n):
    """bf16 rows whose 64-value groups span bf16's exponents (fp8 saturation, e4m3 subnormals,
    every UE8M0 range), with a zero group and infinities and NaNs among them."""
    exps = torch.randint(-135, 128, (n, 8), generator=gen, device=DEV).repeat_interleave(64, 1)
    rows = (torch.randn(n, D, generator=gen, device=DEV).double() * torch.pow(2.0, exps.double()))
    rows = rows.bfloat16()
    rows[0, :64] = 0
    rows[1, 64:128] = -0.0
    flat = rows.view(-1)
    special = torch.randint(0, n * D, (60,), generator=gen, device=DEV)
    flat[special[:20]] = math.inf
    flat[special[20:40]] = -math.inf
    flat[special[40:]] = math.nan
    return rows


def poisoned_pool(layout, blocks, block_size, device):
    """A pool of `layout` with packed pages over a buffer of 0xAB bytes: (buffer, pool)."""
    if layout == "fp8_ds_mla":
        page = -(-block_size * 584 // 576) * 576 + 576
        buf = torch.full((blocks, page), 0xAB, dtype=torch.uint8, device=device)
        return buf, buf.as_strided((blocks, block_size, 584), (page, 584, 1))
    width = 2 * D if layout == "bf16" else D
    buf = torch.full((blocks, block_size + 8, width), 0xAB, dtype=torch.uint8, device=device)
    dtype = torch.bfloat16 if layout == "bf16" else torch.float8_e4m3fn
    return buf, buf.view(dtype)[:, :block_size]


@pytest.mark.parametrize("layout", ["bf16", "fp8_e4m3", "fp8_ds_mla"])
def test_quantize_kv_writes_the_cpu_bytes(layout):
    """quantize_kv into a CUDA pool writes the CPU quantizer's bytes (whole buffers compared,
    page tails and unwritten slots included); a slot past the pool, which only a host call can
    refuse, is skipped on the device."""
    gen = torch.Generator(device=DEV).manual_seed(fresh_seed())
    blocks, block_size, n = 6, 16, 80
    rows = quantize_rows(gen, n)
    slots = torch.randperm(blocks * block_size, generator=gen, device=DEV)[:n].int()
    slots[::9] = -1
    device_slots = slots.clone()
    device_slots[4] = blocks * block_size
    slots[4] = -1
    buf, pool = poisoned_pool(layout, blocks, block_size, DEV)
    cpu_buf, cpu_pool = poisoned_pool(layout, blocks, block_size, "cpu")
    smla.quantize_kv(rows=rows, slots=device_slots, pool=pool, kv_scale=0.5)
    smla.quantize_kv(rows=rows.cpu(), slots=slots.cpu(), pool=cpu_pool, kv_scale=0.5)
    torch.cuda.synchronize()
    assert (cpu_buf != 0xAB).any(), "the CPU quantizer wrote nothing"
    assert torch.equal(buf.cpu(), cpu_buf)


def _numpy(t, np, ml_dtypes):
    """A host copy of a CUDA tensor as NumPy (bf16 through ml_dtypes)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    return t.cpu().numpy()
