"""Host time of an eager smla.sparse_mla_decode call with CUDA tensors (2 x 2 tokens, H=64,
K=640) and of its parts, in us a call (a loop of 3000 after 100 warm-ups), beside a one-kernel
PyTorch op for scale. Run from the repo root with the package installed (gpu_check.sh python
runs it after the package's tests).
"""
import sys
import time

import torch

import smla
import smla.decode as d
from smla import _smla
from smla._arrays import on_device, stream_handle, tensor

sys.path.insert(0, "python/tests")
from test_torch_ops import decode_case  # noqa: E402

case = decode_case("cuda", q_lens=(2, 2), heads=64, top_p=512)
q = case["query"]


def us(f, n=3000):
    for _ in range(100):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    r = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return r


def kernel_us(launches=50, replays=40):
    """GPU time of one decode: a graph of `launches` of them (so that the GPU, not the graph's
    submission, paces a replay) replayed between two events."""
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        smla.sparse_mla_decode(**case)  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(launches):
                smla.sparse_mla_decode(**case)
    graph.replay()  # untimed: the first replay uploads the graph
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) * 1e3 / (launches * replays)


names = [k for k, v in case.items() if isinstance(v, torch.Tensor)]
print("tensors", len(names))
full, kernel = us(lambda: smla.sparse_mla_decode(**case)), kernel_us()
print("full call          %.1f" % full)
print("its kernel (GPU)   %.1f%s" % (kernel, "  (not below the host time: the loop may have timed"
                                            " the GPU)" if kernel > 0.8 * full else ""))
print("tensor() x all     %.1f" % us(lambda: [tensor(case[k], k) for k in names]))
print("stream_handle      %.1f" % us(lambda: stream_handle(None, ("cuda", 0), q)))
print("raw stream         %.1f" % us(lambda: torch._C._cuda_getCurrentRawStream(0)))


def guard():
    with on_device(("cuda", 0), q):
        pass


print("on_device          %.1f" % us(guard))
args = {}
real = _smla.sparse_mla_decode


class Grab:  # the extension, but its decode only keeps the arguments it was given
    def __getattr__(self, k):
        return getattr(_smla, k)

    def sparse_mla_decode(self, **kw):
        args.update(kw)


d._smla = Grab()
smla.sparse_mla_decode(**case)
d._smla = _smla
print("C++ call + launch  %.1f" % us(lambda: real(**args)))
print("empty torch launch %.1f" % us(lambda: torch.empty(1, device="cuda").zero_()))
