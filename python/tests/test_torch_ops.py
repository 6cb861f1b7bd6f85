"""torch.ops.smla (smla.torch_ops): each op equals the plain call bit for bit, passes
torch.library.opcheck (schema, mutations, fake tensors, AOT dispatch), and runs under
torch.compile(fullgraph=True) with the eager result, as do the plain and engine-shaped calls
(traced, they become the ops), on the CPU and on CUDA when there is one.
Skipped without torch. Random inputs are fresh per test; outputs start as NaN."""

import itertools
import math

import pytest

torch = pytest.importorskip("torch")

import smla  # noqa: E402
import smla.torch_ops  # noqa: E402,F401  (registers torch.ops.smla)
from smla.engine import trtllm_batch_decode_sparse_mla_dsv4  # noqa: E402
from np_reference import fresh_rng  # noqa: E402

D, W = smla.HEAD_DIM, smla.WINDOW
DEVICES = ["cpu"] + (["cuda"] if smla.WITH_CUDA and torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: the same code objects traced by many tests would meet
    torch.compile's recompile limit."""
    torch._dynamo.reset()


def decode_case(device, q_lens=(1, 2, 2), heads=16, top_p=256, blocks=24, block_size=64):
    """Keyword arguments of smla.sparse_mla_decode on `device`, outputs NaN."""
    gen = torch.Generator().manual_seed(int(fresh_rng().integers(2**62)))
    T, rows = sum(q_lens), blocks * block_size
    case = dict(
        query=torch.randn(T, heads, D, generator=gen).bfloat16(),
        swa_kv_cache=torch.randn(blocks, block_size, D, generator=gen).bfloat16(),
        compressed_kv_cache=torch.randn(blocks, block_size, D, generator=gen).bfloat16(),
        sparse_indices=torch.randint(-1, rows, (T, W + top_p), generator=gen, dtype=torch.int32),
        sparse_topk_lens=torch.randint(W, W + top_p + 1, (T,), generator=gen, dtype=torch.int32),
        seq_lens=torch.tensor([300 + 211 * i for i in range(len(q_lens))], dtype=torch.int32),
        cum_seq_lens_q=torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32),
        sinks=torch.randn(heads, generator=gen),
        out=torch.full((T, heads, D), math.nan, dtype=torch.bfloat16),
        lse=torch.full((T, heads), math.nan))
    case = {k: v.to(device) for k, v in case.items()}
    case.update(max_q_len=max(q_lens), bmm1_scale=D**-0.5, bmm2_scale=1.0, kv_counters=None,
                workspace=None)
    if device == "cuda":
        case.update(kv_counters=smla.kv_counter_buffer(T, heads),
                    workspace=smla.workspace_buffer(T, heads, W + top_p))
    return case


def fresh_outputs(case):
    return dict(case, out=torch.full_like(case["out"], math.nan),
                lse=torch.full_like(case["lse"], math.nan))


def assert_bitwise(got, want):
    assert torch.isfinite(got.float()).all(), "an element not written (NaN)"
    assert torch.equal(got.view(torch.int16) if got.dtype == torch.bfloat16 else got,
                       want.view(torch.int16) if want.dtype == torch.bfloat16 else want)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_op_equals_the_call(device):
    case = dict(decode_case(device), bmm2_scale=0.5)  # every scalar reaches the call
    smla.sparse_mla_decode(**case)
    op = fresh_outputs(case)
    torch.ops.smla.sparse_mla_decode(**op)
    assert_bitwise(op["out"], case["out"])
    assert_bitwise(op["lse"], case["lse"])


@pytest.mark.parametrize("device", DEVICES)
def test_decode_op_reads_a_topk_as_the_call_does(device):
    """TopkColumns' fields flattened into the op's arguments: decode rows of a top-k of local
    entries (-1 padded, valid ones first) into a compressed pool through its block table."""
    gen = torch.Generator().manual_seed(int(fresh_rng().integers(2**62)))
    case = decode_case(device, q_lens=(1, 1, 1), top_p=0)
    T, E, pages = 3, 16, 4
    topk = dict(topk_indices=torch.randint(-1, pages * E, (T, 12), generator=gen,
                                           dtype=torch.int32).sort(1, descending=True).values,
                topk_block_table=torch.randperm(24, generator=gen)[:T * pages].int().view(T, pages),
                is_valid_token=torch.tensor([1, 0, 1], dtype=torch.uint8))  # token 1: padding
    topk = {k: v.to(device) for k, v in topk.items()}
    # Short sequences: a prefill row would take fewer entries (pos + 1) / 4 than a decode row.
    case.update(compressed_kv_cache=torch.randn(24, E, D, generator=gen).bfloat16().to(device),
                seq_lens=torch.tensor([9, 21, 33], dtype=torch.int32, device=device),
                sparse_topk_lens=None, max_q_len=1)
    smla.sparse_mla_decode(**case, topk_columns=smla.TopkColumns(
        topk["topk_indices"], topk["topk_block_table"], compress_ratio=4, num_decodes=T,
        is_valid_token=topk["is_valid_token"]))
    op = dict(fresh_outputs(case), **topk, compress_ratio=4, num_decodes=T)
    torch.ops.smla.sparse_mla_decode(**op)
    assert_bitwise(op["out"], case["out"])
    assert_bitwise(op["lse"], case["lse"])
    torch.library.opcheck(torch.ops.smla.sparse_mla_decode.default, (), fresh_outputs(op))


def test_decode_op_names_the_topk_fields_as_its_arguments():
    """The op's errors name a top-k field by the op's own argument (topk_block_table), not as
    TopkColumns' field (topk_columns.block_table), which its callers never wrote."""
    case = dict(decode_case("cpu", q_lens=(1, 1, 1), top_p=0), sparse_topk_lens=None,
                seq_lens=torch.tensor([9, 21, 33], dtype=torch.int32),
                topk_indices=torch.full((3, 12), -1, dtype=torch.int32),
                topk_block_table=torch.zeros(3, 4, dtype=torch.int32),
                is_valid_token=torch.ones(3, dtype=torch.uint8), compress_ratio=4, num_decodes=3)
    torch.ops.smla.sparse_mla_decode(**case)  # the case itself is taken
    for error, name, bad in (
            (TypeError, "topk_indices", case["topk_indices"].long()),
            (TypeError, "topk_block_table", case["topk_block_table"].long()),
            (TypeError, "is_valid_token", case["is_valid_token"].int()),
            (ValueError, "compress_ratio", 0), (ValueError, "num_decodes", 4)):
        with pytest.raises(error, match=f"^smla: {name}: expected ") as info:
            torch.ops.smla.sparse_mla_decode(**dict(fresh_outputs(case), **{name: bad}))
        assert info.value.argument == name
        assert "topk_columns" not in str(info.value)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_call_with_topk_columns_equals_eager(device):
    """The plain call with TopkColumns, traced (fullgraph: it becomes the op), reads the top-k
    as the eager call does: every field reaches the op, num_decodes (requests 0 and 1 decode,
    2 prefills) and is_valid_token (token 1 is padding) among them."""
    gen = torch.Generator().manual_seed(int(fresh_rng().integers(2**62)))
    case = decode_case(device, q_lens=(1, 1, 1), top_p=0)
    T, E, pages = 3, 16, 4
    topk = smla.TopkColumns(
        torch.randint(-1, pages * E, (T, 12), generator=gen, dtype=torch.int32)
        .sort(1, descending=True).values.to(device),  # -1 padded, valid ones first
        torch.randperm(24, generator=gen)[:T * pages].int().view(T, pages).to(device),
        compress_ratio=4, num_decodes=2,
        is_valid_token=torch.tensor([1, 0, 1], dtype=torch.uint8, device=device))
    case.update(compressed_kv_cache=torch.randn(24, E, D, generator=gen).bfloat16().to(device),
                seq_lens=torch.tensor([9, 21, 33], dtype=torch.int32, device=device),
                sparse_topk_lens=None, max_q_len=1)
    smla.sparse_mla_decode(**case, topk_columns=topk)

    def layer(out, lse):
        smla.sparse_mla_decode(**dict(case, out=out, lse=lse), topk_columns=topk)
        return out.float() + 1

    compiled = fresh_outputs(case)
    backend = "inductor" if device == "cuda" else "aot_eager"
    got = torch.compile(layer, fullgraph=True, backend=backend)(compiled["out"], compiled["lse"])
    assert_bitwise(compiled["out"], case["out"])
    assert_bitwise(compiled["lse"], case["lse"])
    assert_bitwise(got, case["out"].float() + 1)


def test_torch_tensors_convert_or_are_refused_by_name():
    """Tensors that require grad and nn.Parameters are read as they are; a pending negation,
    a sparse or meta tensor, a torch object that is no tensor, or an output that requires grad
    is a TypeError naming the argument (not a wrong result, not another exception)."""
    case = decode_case("cpu")
    smla.sparse_mla_decode(**case)
    got = fresh_outputs(case)
    smla.sparse_mla_decode(**dict(got, query=case["query"].clone().requires_grad_(),
                                  sinks=torch.nn.Parameter(case["sinks"].clone())))
    assert_bitwise(got["out"], case["out"])
    sinks = case["sinks"]
    for bad, why in ((torch._neg_view(sinks), "negative bit"), (sinks.to_sparse(), "sparse"),
                     (sinks.to("meta"), "meta"), (torch.float32, "got dtype")):
        with pytest.raises(TypeError, match=f"smla: sinks: .*{why}"):
            smla.sparse_mla_decode(**dict(fresh_outputs(case), sinks=bad))
    # An output that requires grad would be written outside autograd.
    outs = fresh_outputs(case)
    outs["out"].requires_grad_()
    with pytest.raises(TypeError, match="smla: out: .*does not require grad.*requires grad"):
        smla.sparse_mla_decode(**outs)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_op_passes_opcheck(device):
    torch.library.opcheck(torch.ops.smla.sparse_mla_decode.default, (), decode_case(device))


def call_op(**case):
    torch.ops.smla.sparse_mla_decode(**case)


def call_engine(*, workspace, kv_counters, **case):
    trtllm_batch_decode_sparse_mla_dsv4(workspace_buffer=workspace,
                                        multi_ctas_kv_counter_buffer=kv_counters, **case)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call", [call_op, smla.sparse_mla_decode, call_engine],
                         ids=["op", "call", "engine_call"])
def test_compiled_decode_equals_eager(device, call):
    """One graph (fullgraph: no break) with the decode between two traced computations, its
    output used after it, whether the op is called or the plain or engine-shaped function (which
    become the op when traced): the compiled function's result equals the eager one's."""
    case = decode_case(device)

    def layer(query, out, lse):
        call(**dict(case, query=query * 2, out=out, lse=lse))
        return out.float() + 1, lse * 2

    eager = layer(case["query"], case["out"], case["lse"])
    compiled = fresh_outputs(case)
    backend = "inductor" if device == "cuda" else "aot_eager"  # no C++ toolchain needed on CPU
    got = torch.compile(layer, fullgraph=True, backend=backend)(
        case["query"], compiled["out"], compiled["lse"])
    assert_bitwise(compiled["out"], case["out"])
    for g, e in zip(got, eager):
        assert_bitwise(g, e)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_call_of_what_no_op_takes_runs_the_call(device):
    """A traced call with values no operator takes (a with_dtype view, a tensor scale) or a
    stream stays the plain call, run eagerly at a graph break: the result is the eager one's."""
    case = decode_case(device)
    smla.sparse_mla_decode(**case)
    for changed in (dict(query=smla.with_dtype(case["query"].view(torch.int16), "bf16")),
                    dict(bmm2_scale=torch.tensor(1.0)), dict(stream=0)):
        torch._dynamo.reset()

        def layer(out, lse):
            smla.sparse_mla_decode(**dict(case, out=out, lse=lse, **changed))
            return out.float() + 1

        compiled = fresh_outputs(case)
        got = torch.compile(layer, backend="aot_eager")(compiled["out"], compiled["lse"])
        assert_bitwise(compiled["out"], case["out"])
        assert_bitwise(got, case["out"].float() + 1)


@pytest.mark.parametrize("device", DEVICES)
def test_engine_call_uniform_q_len_from_4d_query(device):
    """A [B, q, H, D] query with no cum_seq_lens_q: q tokens a request, offsets made as a
    tensor on the query's device; the op's bits, eagerly and compiled."""
    case = decode_case(device, q_lens=(2, 2, 2))
    smla.sparse_mla_decode(**case)
    B, q = 3, 2
    engine = {k: case[k] for k in ("swa_kv_cache", "compressed_kv_cache", "sparse_indices",
                                   "sparse_topk_lens", "seq_lens", "sinks", "bmm1_scale")}

    def layer(query, out):
        trtllm_batch_decode_sparse_mla_dsv4(
            query=query.view(B, q, *query.shape[1:]), out=out.view(B, q, *out.shape[1:]),
            workspace_buffer=case["workspace"],
            multi_ctas_kv_counter_buffer=case["kv_counters"], **engine)
        return out.float() + 1

    eager = torch.full_like(case["out"], math.nan)
    layer(case["query"], eager)
    assert_bitwise(eager, case["out"])
    compiled = torch.full_like(case["out"], math.nan)
    backend = "inductor" if device == "cuda" else "aot_eager"
    got = torch.compile(layer, fullgraph=True, backend=backend)(case["query"], compiled)
    assert_bitwise(compiled, case["out"])
    assert_bitwise(got, case["out"].float() + 1)


def test_engine_call_refuses_a_4d_out_that_needs_a_copy():
    """A [B, q, H, D] out stored q-major cannot become [T, H, D] without a copy (which would
    lose the writes): a ValueError naming out and its strides, not torch's AttributeError."""
    case = decode_case("cpu", q_lens=(2, 2, 2))
    engine = {k: case[k] for k in ("swa_kv_cache", "compressed_kv_cache", "sparse_indices",
                                   "sparse_topk_lens", "seq_lens", "sinks", "bmm1_scale")}
    out = torch.full((2, 3, *case["out"].shape[1:]), math.nan, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"smla: out: .*strides \(\d+, \d+, \d+, 1\) "
                                         r"\(elements\)") as info:
        trtllm_batch_decode_sparse_mla_dsv4(
            query=case["query"].view(3, 2, *case["query"].shape[1:]), out=out.transpose(0, 1),
            workspace_buffer=None, multi_ctas_kv_counter_buffer=None, **engine)
    assert info.value.argument == "out"
    assert torch.isnan(out.float()).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pool_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_quantize_op_equals_the_call_and_compiles(device, pool_dtype):
    gen = torch.Generator().manual_seed(int(fresh_rng().integers(2**62)))
    blocks, block_size, n = 4, 16, 40
    rows = torch.randn(n, D, generator=gen).bfloat16().to(device)
    slots = torch.randperm(blocks * block_size, generator=gen)[:n].int().to(device)
    slots[::7] = -1  # skipped

    def fresh_pool():
        return torch.zeros(blocks, block_size, D, device=device).to(pool_dtype)

    want = fresh_pool()
    smla.quantize_kv(rows=rows, slots=slots, pool=want, kv_scale=0.5)
    got = fresh_pool()
    torch.ops.smla.quantize_kv(rows=rows, slots=slots, pool=got, kv_scale=0.5)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert want.view(torch.uint8).any()
    if pool_dtype == torch.bfloat16:  # opcheck compares e4m3 tensors by arithmetic they lack
        torch.library.opcheck(torch.ops.smla.quantize_kv.default, (),
                              dict(rows=rows, slots=slots, pool=fresh_pool(), kv_scale=0.5))

    for quantize in (torch.ops.smla.quantize_kv, smla.quantize_kv):
        def write(pool):
            quantize(rows=rows * 1, slots=slots, pool=pool, kv_scale=0.5)
            return pool.view(torch.uint8).long().sum()

        compiled = fresh_pool()
        backend = "inductor" if device == "cuda" else "aot_eager"
        total = torch.compile(write, fullgraph=True, backend=backend)(compiled)
        assert torch.equal(compiled.view(torch.uint8), want.view(torch.uint8))
        assert total.item() == want.view(torch.uint8).long().sum().item()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device: torch names its own")
def test_cuda_device_without_a_cuda_device_reads_as_without_torch():
    """"cuda" (no index) where torch is imported but has no CUDA device (a CPU build, no
    driver) is cuda:0, as without torch: the queries answer, not torch's RuntimeError or
    AssertionError from asking it for its current device."""
    assert smla.max_topk_width("cuda") == (2048 if smla.WITH_CUDA else 0)
    assert smla.workspace_bytes(4, 16, W + 256) == smla.workspace_bytes(4, 16, W + 256, "cuda:0")
    assert smla.query_capability(D, "bf16", "bf16", 64, "cuda") == \
        smla.query_capability(D, "bf16", "bf16", 64, "cuda:0")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call", [smla.sparse_mla_decode, call_engine], ids=["call", "engine_call"])
def test_compiled_call_into_a_strided_out_equals_eager(device, call):
    """An out the call takes eagerly that is no contiguous tensor (the heads of a wider buffer):
    traced, the call stays one op node (fullgraph), not dynamo's refusal of a non-contiguous
    `out=` keyword, and writes the eager bits there, leaving the rest of the buffer."""
    case = decode_case(device)
    smla.sparse_mla_decode(**case)
    T, H, _ = case["out"].shape

    def layer(buffer, lse):
        call(**dict(case, out=buffer[:, :H], lse=lse))
        return buffer.float() + 1

    buffer = torch.full((T, H + 4, D), math.nan, dtype=torch.bfloat16, device=device)
    lse = torch.full_like(case["lse"], math.nan)
    backend = "inductor" if device == "cuda" else "aot_eager"
    got = torch.compile(layer, fullgraph=True, backend=backend)(buffer, lse)
    assert_bitwise(buffer[:, :H], case["out"])
    assert torch.isnan(buffer[:, H:].float()).all()
    assert_bitwise(lse, case["lse"])
    assert_bitwise(got[:, :H], case["out"].float() + 1)


def test_compiled_engine_call_reads_host_offsets_for_max_q_len():
    """An engine-shaped call without max_q_len, whose host cum_seq_lens_q gives it, traced: the
    offsets are read eagerly (a graph break: their values are no trace's), not dynamo's
    internal error on the DLPack device query of a traced tensor; the result is the eager one's."""
    case = decode_case("cpu")
    smla.sparse_mla_decode(**case)
    engine = {k: case[k] for k in ("swa_kv_cache", "compressed_kv_cache", "sparse_indices",
                                   "sparse_topk_lens", "seq_lens", "cum_seq_lens_q", "sinks",
                                   "bmm1_scale")}

    def layer(query):
        return trtllm_batch_decode_sparse_mla_dsv4(query=query, **engine).float() + 1

    got = torch.compile(layer, backend="aot_eager")(case["query"])
    assert_bitwise(got, case["out"].float() + 1)
