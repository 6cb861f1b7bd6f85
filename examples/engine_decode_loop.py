"""An engine-style decode loop over smla: the first layers of V4.1-Flash in two SWA groups,
tables shared across layers (SparseIndexTables inside StepExecutor), counters and workspace
allocated once. On CUDA (PyTorch) the first step runs eagerly, then the whole step - every
layer's table lookups and attention - is captured into one CUDA graph and replayed each step
with new values written into the same buffers, as engines do. Without CUDA it runs the same
loop on the CPU backend with NumPy arrays.

    python examples/engine_decode_loop.py [--layers 8] [--requests 4] [--q-len 1] [--steps 5] [--cpu]
"""

import argparse
import time

import numpy as np

import smla

BLOCK = 64          # SWA page: 64 tokens
ENTRIES = 16        # compressed page: 16 entries
MAX_SEQ = 4096


class Arrays:
    """Array making on one device: torch on CUDA, NumPy (bf16 through ml_dtypes) on the CPU."""

    def __init__(self, cuda: bool, seed: int = 0):
        self.cuda = cuda
        self.rng = np.random.default_rng(seed)
        if cuda:
            import torch
            self.torch = torch
        else:
            import ml_dtypes
            self.bf16 = ml_dtypes.bfloat16

    def put(self, host: np.ndarray):
        """A device (or host) array holding `host`'s values (int32/uint8/float32)."""
        return self.torch.from_numpy(host).cuda() if self.cuda else host

    def randn_bf16(self, *shape):
        if self.cuda:
            return self.torch.randn(*shape, device="cuda").bfloat16()
        return self.rng.standard_normal(shape, dtype=np.float32).astype(self.bf16)

    def empty_bf16(self, *shape):
        if self.cuda:
            return self.torch.empty(*shape, device="cuda", dtype=self.torch.bfloat16)
        return np.empty(shape, self.bf16)

    def write(self, dst, host: np.ndarray):
        """New values into a buffer a captured graph reads (in place, same address)."""
        if self.cuda:
            dst.copy_(self.torch.from_numpy(host), non_blocking=False)
        else:
            dst[...] = host


def build_model(xp: Arrays, num_layers: int, num_requests: int):
    preset = smla.model_preset("v41-flash")
    specs = smla.model_layers(preset, num_swa_groups=2)[:num_layers]
    heads = preset.num_heads
    swa_pages = num_requests * (MAX_SEQ // BLOCK)
    layers, compressed_pools = [], {}
    for s in specs:
        if s.compress_ratio and s.kv_source not in compressed_pools:
            pages = num_requests * (MAX_SEQ // s.compress_ratio // ENTRIES + 1)
            compressed_pools[s.kv_source] = xp.randn_bf16(pages, ENTRIES, smla.HEAD_DIM)
        layers.append(smla.AttentionLayer(
            spec=s, swa_kv_cache=xp.randn_bf16(swa_pages, BLOCK, smla.HEAD_DIM),
            bmm1_scale=smla.HEAD_DIM ** -0.5,
            compressed_kv_cache=compressed_pools.get(s.kv_source) if s.compress_ratio else None,
            sinks=xp.put(xp.rng.standard_normal(heads).astype(np.float32))))
    return specs, heads, layers


def page_table(xp: Arrays, num_requests: int, pages_per_request: int, pool_pages: int):
    table = xp.rng.permutation(pool_pages)[:num_requests * pages_per_request]
    return xp.put(table.reshape(num_requests, pages_per_request).astype(np.int32))


class Step:
    """The buffers a step reads; each step writes new values into the same ones."""

    def __init__(self, xp: Arrays, specs, heads, num_requests, q_len):
        self.xp, self.specs, self.q_len = xp, specs, q_len
        self.num_tokens = num_requests * q_len
        self.seq_lens_host = xp.rng.integers(200, MAX_SEQ // 2, num_requests).astype(np.int32)
        cum = (np.arange(num_requests + 1) * q_len).astype(np.int32)
        self.seq_lens = xp.put(self.seq_lens_host.copy())
        self.metadata = smla.StepMetadata(num_tokens=self.num_tokens, seq_lens=self.seq_lens,
                                          cum_seq_lens_q=xp.put(cum), num_decodes=num_requests,
                                          max_q_len=q_len)
        swa_pages = num_requests * (MAX_SEQ // BLOCK)
        block_tables = [page_table(xp, num_requests, MAX_SEQ // BLOCK, swa_pages)
                        for _ in range(2)]
        compressed, self.topk, self.widths = {}, {}, {}
        for s in specs:
            if not s.compress_ratio:
                continue
            pages = MAX_SEQ // s.compress_ratio // ENTRIES + 1
            compressed.setdefault(s.kv_source, page_table(xp, num_requests, pages,
                                                          num_requests * pages))
            if s.index_source not in self.topk:
                width = smla.topk_width(s, MAX_SEQ)
                self.widths[s.index_source] = (width, s.compress_ratio)
                self.topk[s.index_source] = xp.put(np.full((self.num_tokens, width), -1,
                                                           np.int32))
        self.inputs = smla.StepInputs(metadata=self.metadata, block_tables=block_tables,
                                      compressed_block_tables=compressed,
                                      topk_indices=self.topk)
        self.queries = [xp.randn_bf16(self.num_tokens, heads, smla.HEAD_DIM) for _ in specs]
        self.outs = [xp.empty_bf16(self.num_tokens, heads, smla.HEAD_DIM) for _ in specs]
        self.max_columns = smla.WINDOW + max([w for w, _ in self.widths.values()], default=0)

    def advance(self):
        """The next step's values: every request one token further, a fresh top-k (what the
        indexers would write), fresh queries (what the layers before attention would write)."""
        xp = self.xp
        self.seq_lens_host += self.q_len
        xp.write(self.seq_lens, self.seq_lens_host)
        for source, (width, ratio) in self.widths.items():
            topk = np.full((self.num_tokens, width), -1, np.int32)
            for t in range(self.num_tokens):
                request, i = divmod(t, self.q_len)
                visible = (self.seq_lens_host[request] - self.q_len + i + 1) // ratio
                n = min(width, visible)
                topk[t, :n] = xp.rng.choice(visible, n, replace=False) if n else []
            xp.write(self.topk[source], topk)
        for q in self.queries:
            values = xp.rng.standard_normal(tuple(q.shape)).astype(np.float32)
            xp.write(q, values if xp.cuda else values.astype(xp.bf16))


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected >= 1, got {value}")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=positive, default=8)
    parser.add_argument("--requests", type=positive, default=4)
    parser.add_argument("--q-len", type=positive, default=1, help="query tokens per request")
    parser.add_argument("--steps", type=positive, default=5)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even with CUDA")
    args = parser.parse_args()
    total = len(smla.model_layers(smla.model_preset("v41-flash"), num_swa_groups=2))
    if args.layers > total:
        parser.error(f"--layers: expected at most {total} (V4.1-Flash's), got {args.layers}")
    # Requests start below MAX_SEQ / 2 and grow q_len a step, the first step's included.
    grown = (args.steps + 1) * args.q_len
    if grown > MAX_SEQ // 2 + 1:
        parser.error(f"--steps {args.steps} x --q-len {args.q_len}: requests would pass the "
                     f"{MAX_SEQ} positions their page tables hold ((steps + 1) * q_len "
                     f"<= {MAX_SEQ // 2 + 1}, got {grown})")

    cuda = False
    if not args.cpu:
        try:
            import torch
            cuda = torch.cuda.is_available() and smla.WITH_CUDA
        except ImportError:
            pass
    xp = Arrays(cuda)
    specs, heads, layers = build_model(xp, args.layers, args.requests)
    step = Step(xp, specs, heads, args.requests, args.q_len)
    step.advance()
    print(f"smla {smla.__version__} on {'cuda' if cuda else 'cpu'}: {len(specs)} layers "
          f"(keys {[smla.sparse_index_key(s) for s in specs]}), {step.num_tokens} tokens, "
          f"{heads} heads, up to {step.max_columns} columns")

    if cuda:
        run_cuda(xp, layers, step, args.steps)
    else:
        executor = smla.StepExecutor(layers, step.num_tokens, step.max_columns)
        for i in range(args.steps):
            start = time.perf_counter()
            executor.run_step(step.inputs, step.queries, step.outs)
            print(f"step {i}: {1e3 * (time.perf_counter() - start):.1f} ms, "
                  f"table builds {sum(executor.stats['builds'].values())}, "
                  f"forks {len(executor.stats['forks'])}")
            step.advance()
    print("all outputs finite:", all(np.isfinite(np.asarray(o, np.float32)).all()
                                     for o in _host(xp, step.outs)))


def run_cuda(xp, layers, step, steps):
    torch = xp.torch
    stream = torch.cuda.Stream()  # the step's stream: the executor and the capture share it
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        executor = smla.StepExecutor(layers, step.num_tokens, step.max_columns)
        executor.run_step(step.inputs, step.queries, step.outs)  # eager: serves the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        executor.run_step(step.inputs, step.queries, step.outs)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(steps):
        step.advance()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        if i == 0:  # the replay equals an eager run of the same step, bit for bit
            replayed = [o.clone() for o in step.outs]
            with torch.cuda.stream(stream):
                executor.run_step(step.inputs, step.queries, step.outs)
            torch.cuda.synchronize()
            same = all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                       for a, b in zip(replayed, step.outs))
            print(f"replay == eager: {same}")
        print(f"step {i}: graph replay {start.elapsed_time(end) * 1e3:.1f} us")


def _host(xp, arrays):
    if not xp.cuda:
        return [a.astype(np.float32) for a in arrays]
    return [a.float().cpu().numpy() for a in arrays]


if __name__ == "__main__":
    main()
