"""Arrays in, `_smla.Tensor` views out (DLPack, no copy), and the stream a call runs on.

NumPy has no bf16 or fp8 dtypes: arrays of ml_dtypes' bfloat16 / float8_e4m3fn are passed as
their raw bits with the dtype named, and so is any array wrapped in `with_dtype`. Frameworks
are recognised among the modules already imported (subclasses of their array types too), so
a NumPy caller never imports torch.
"""

import collections.abc
import math
import numbers
import operator
import re
import sys
from typing import Any, NamedTuple

from . import _smla
from ._errors import type_error, value_error

# ml_dtypes dtype name -> (the NumPy integer type of the same size, smla's dtype name)
_RAW_NUMPY = {"bfloat16": ("uint16", "bf16"), "float8_e4m3fn": ("uint8", "f8e4m3")}


class Typed(NamedTuple):
    """An array whose elements are to be read as `dtype` (see with_dtype)."""

    array: Any
    dtype: str


def with_dtype(array, dtype: str) -> Typed:
    """Read `array`'s elements as smla dtype `dtype` ("bf16", "f8e4m3", "f32", "i32", "u8"):
    a uint16 array holding bf16 bits, a uint8 one holding e4m3 values (a uint8 pool without it
    is fp8_ds_mla bytes). The element sizes must agree; nothing is copied."""
    return Typed(array, dtype)


# (module, array type) of the frameworks whose streams and dtypes a call knows.
_FRAMEWORKS = (("torch", "Tensor"), ("cupy", "ndarray"), ("numpy", "ndarray"))


def framework_of(x) -> str:
    """"torch", "cupy" or "numpy" for their arrays, subclasses too (an engine's own tensor
    type must run on PyTorch's stream), else the top module of x's type."""
    if isinstance(x, Typed):
        x = x.array
    for name, array_type in _FRAMEWORKS:
        module = sys.modules.get(name)  # an array of a framework means it is imported
        if module is not None and isinstance(x, getattr(module, array_type)):
            return name
    return type(x).__module__.partition(".")[0]


def on_a_device(x) -> bool:
    """Whether an array lives off the host (DLPack's device of anything that exports one)."""
    if isinstance(x, Typed):
        x = x.array
    dlpack_device = getattr(x, "__dlpack_device__", None)
    return dlpack_device is not None and dlpack_device()[0] not in (1, 3)  # CPU, CUDA host


def _stream_framework(like) -> str:
    """Whose current stream a CUDA call without an explicit stream runs on: the framework of
    `like`, or, with nothing to go by (tables, executors), PyTorch's or CuPy's if imported."""
    if like is not None:
        return framework_of(like)
    for name in ("torch", "cupy"):
        if name in sys.modules:
            return name
    return ""


# torch.Tensor, once a torch array has been seen: its arguments take the short path in tensor().
_torch_tensor_type = None


def _torch_capsule(x, name: str, dtype, writable: bool):
    """(what _smla.Tensor imports, dtype, holds) for a torch tensor: ATen's own DLPack capsule,
    since Tensor.__dlpack__ costs ~6x as much in Python checks and refuses a CUDA tensor of a
    device that is not the current one, which a call on it makes current only afterwards
    (on_device); holds: the tensor's dtype name where the capsule is of its raw bits."""
    torch = sys.modules["torch"]
    if x.requires_grad:  # DLPack refuses tensors that require grad: inputs are only read
        if writable:  # a write autograd would not see
            raise type_error(name, "an output tensor that does not require grad (the call "
                             "writes it outside autograd; pass .detach() to write it anyway)",
                             "a tensor that requires grad")
        x = x.detach()
    if x.is_neg():  # a pending negation: the memory holds the values' negatives
        raise type_error(name, "a tensor without a pending negation (.resolve_neg())",
                         "a tensor with the negative bit set")
    holds = None
    if x.dtype == getattr(torch, "float8_e4m3fn", None):  # older exports lack fp8 codes
        x, dtype, holds = x.view(torch.uint8), dtype or "f8e4m3", "float8_e4m3fn"
    try:
        return torch.utils.dlpack.to_dlpack(x), dtype, holds
    except (RuntimeError, BufferError) as e:
        raise type_error(name, "a strided CPU or CUDA tensor",
                         f"a {x.layout} tensor on {x.device}: {e}") from None


# The dtypes an argument takes (`takes` of tensor()), by smla's names: errors for an array of
# another element type name them and the conversion to them.
I32, F32, U8, BF16 = "i32", "f32", "u8", "bf16"
QUERY = "bf16,f8e4m3"          # bf16, or e4m3 with a per-tensor fp8 cache
POOL = "bf16,f8e4m3,u8"        # bf16, per-tensor fp8 or fp8_ds_mla bytes
COUNTERS = "u8,i32"            # kv_counters: a buffer of either


def tensor(x, name: str, writable: bool = False, required: str = "", takes: str = ""):
    """The `_smla.Tensor` view of `x`, None for None (a ValueError where `required` describes
    what must come). `name` is the argument's name, used in errors; `writable` for outputs;
    `takes` the dtypes the argument accepts (I32, POOL, ...), which a dtype error names."""
    global _torch_tensor_type
    if type(x) is _torch_tensor_type:  # engines' arguments: checked first
        capsule, dtype, holds = _torch_capsule(x, name, None, writable)
        return _smla.Tensor(capsule, name, dtype, writable, takes, holds)
    if x is None:
        if required:
            raise value_error(name, required, "None")
        return None
    dtype = holds = None
    if isinstance(x, Typed):
        x, dtype = x.array, x.dtype
        if not isinstance(dtype, str):
            raise type_error(name, "with_dtype's dtype as a name (bf16, f8e4m3, f32, i32, u8)",
                             type(dtype).__name__)
        if x is None:
            raise type_error(name, "an array in with_dtype", "None")
        dtype = utf8(dtype)
    torch = sys.modules.get("torch")
    if framework_of(x) == "numpy":
        holds = getattr(getattr(x, "dtype", None), "name", "")
        raw = _RAW_NUMPY.get(holds)
        if raw is not None:
            x, dtype = x.view(raw[0]), dtype or raw[1]
        else:
            holds = None
    elif torch is not None and isinstance(x, torch.Tensor):  # subclasses too (nn.Parameter)
        _torch_tensor_type = torch.Tensor
        x, dtype, holds = _torch_capsule(x, name, dtype, writable)
    return _smla.Tensor(x, name, dtype, writable, takes, holds)


def device_of(t) -> tuple:
    """("cpu", 0) or ("cuda", index) of a `_smla.Tensor`."""
    kind, _, index = t.device.partition(":")
    return kind, int(index or 0)


def parse_device(device) -> tuple:
    """A device given as "cpu", "cuda", "cuda:1", a torch.device or a (kind, index) pair."""
    if isinstance(device, tuple) and len(device) == 2:
        if device[0] not in ("cpu", "cuda"):
            raise type_error("device", "(\"cpu\" or \"cuda\", index)", repr(device))
        return device[0], integer(device[1], "device")
    text = str(device)
    kind, _, index = text.partition(":")
    # An index of digits alone: int() would raise its own error, or take " 1" or "1_0".
    if kind not in ("cpu", "cuda") or (index and not re.fullmatch("-?[0-9]+", index)):
        raise type_error("device", "cpu, cuda or cuda:<index>", repr(device))
    if kind == "cuda" and not index:
        # torch's current device where it has one; a torch without CUDA (a CPU build, no
        # driver) raises when asked, and "cuda" is then cuda:0, as without torch.
        torch = sys.modules.get("torch")
        index = (torch.cuda.current_device()
                 if torch is not None and torch.cuda.is_available() else 0)
    return kind, integer(int(index or 0), "device")


def _stream_value(stream) -> int:
    """The cudaStream_t of an int (NumPy ints too) or of a stream object's .cuda_stream / .ptr."""
    what = "an int cudaStream_t or a stream object"
    if isinstance(stream, bool):
        raise type_error("stream", what, "a bool")
    try:
        value = operator.index(stream)
    except TypeError:
        attr = next((a for a in ("cuda_stream", "ptr") if hasattr(stream, a)), None)
        if attr is None:
            raise type_error("stream", what, type(stream).__name__) from None
        handle = getattr(stream, attr)
        try:
            if isinstance(handle, bool):  # an int to operator.index, but no handle
                raise TypeError
            value = operator.index(handle)
        except TypeError:
            raise type_error("stream", f"a stream object whose .{attr} is an int",
                             repr(handle)) from None
    if not 0 <= value < 1 << 64:
        raise value_error("stream", "a cudaStream_t in 0 .. 2^64 - 1", str(value))
    return value


def stream_handle(stream, device: tuple, like=None) -> int:
    """The cudaStream_t, as an integer, that a call on `device` runs on: `stream` when given
    (an int, a torch.cuda.Stream or anything with .cuda_stream / .ptr), else the current
    stream of the framework `like` comes from (PyTorch, CuPy), else the legacy default (0).
    A stream that is none of these is refused on every device, the CPU's too."""
    if stream is not None:
        stream = _stream_value(stream)
    if device[0] != "cuda":
        return 0
    if stream is None:
        framework = _stream_framework(like)
        if framework == "torch":
            torch = sys.modules["torch"]
            # The handle itself, 0.2 us on the GPU machine; a Stream object first, 3.8 us.
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            return (raw(device[1]) if raw is not None else
                    torch.cuda.current_stream(device[1]).cuda_stream)
        if framework == "cupy":
            return sys.modules["cupy"].cuda.get_current_stream().ptr
        return 0
    return stream


class on_device:
    """Makes `device` PyTorch's current CUDA device for a call: the CUDA backend launches on
    the current device and checks that it is the tensors'."""

    def __init__(self, device: tuple, like=None):
        self._guard = None
        if device[0] == "cuda" and _stream_framework(like) == "torch":
            torch = sys.modules["torch"]
            if torch.cuda.current_device() != device[1]:
                self._guard = torch.cuda.device(device[1])

    def __enter__(self):
        if self._guard is not None:
            self._guard.__enter__()

    def __exit__(self, *exc):
        if self._guard is not None:
            self._guard.__exit__(*exc)


def instance(x, cls, name: str, what: str = ""):
    """`x` where it is a `cls` (what: how to name that kind), else a TypeError naming `name`."""
    if not isinstance(x, cls):
        article = "an" if cls.__name__[0] in "AEIOU" else "a"
        raise type_error(name, what or f"{article} {cls.__name__}", type(x).__name__)
    return x


def items(x, name: str, cls=None) -> list:
    """A sequence argument as a list (of `cls` items where given), else a TypeError naming it."""
    if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
        raise type_error(name, "a sequence", type(x).__name__)
    x = list(x)
    if cls is not None:
        for i, item in enumerate(x):
            instance(item, cls, f"{name}[{i}]")
    return x


def mapping(x, name: str, what: str) -> dict:
    """A dict argument (`what`: how to name its items) as a dict, None as an empty one (the
    dicts a dataclass defaults to empty), else a TypeError naming it."""
    if x is None:
        return {}
    if not isinstance(x, collections.abc.Mapping):
        raise type_error(name, f"a dict {what} (or None: none)", type(x).__name__)
    return dict(x)


def utf8(text: str) -> str:
    """A str name as it can cross to C++ (UTF-8): a character UTF-8 cannot hold (a lone
    surrogate, as os.fsdecode keeps undecodable bytes) escaped, so that the library refuses it
    as the unknown name it is, naming the argument, where nanobind would raise an unnamed
    TypeError; a NUL escaped too, where the library's message would end, as a C string does.
    No name smla takes has such a character or a backslash."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\0", "\\x00")


def integer(x, name: str, bits: int = 32) -> int:
    """An integer argument that fits the C++ parameter's `bits`-bit signed type: ints and NumPy
    integers, never a float or a bool (no truncation, no wrap-around)."""
    if isinstance(x, bool):
        raise type_error(name, "an int", "a bool")
    try:
        value = operator.index(x)
    except TypeError:
        raise type_error(name, "an int", type(x).__name__) from None
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise value_error(name, f"an int{bits} value", str(value))
    return value


_FLT_MAX = 3.4028234663852886e38  # float32's largest finite value and its least subnormal
_FLT_TRUE_MIN = 1.401298464324817e-45


def scale(x, name: str) -> float:
    """A scale as a Python float: floats, NumPy scalars and one-element host tensors. A device
    tensor is refused: reading it would synchronise the stream and break graph capture."""
    if isinstance(x, bool) or str(getattr(x, "dtype", "")) in ("bool", "torch.bool"):
        raise type_error(name, "a float", "a bool")
    if isinstance(x, (str, bytes, bytearray)):  # float() would parse "0.04": text is no scale
        raise type_error(name, "a float", type(x).__name__)
    kind = getattr(getattr(x, "dtype", None), "kind", "")
    if kind in ("m", "M"):  # NumPy times: a unitless timedelta's item() is a plain int
        raise type_error(name, "a float", f"{type(x).__name__} of {x.dtype}")
    if not isinstance(x, (int, float)) and on_a_device(x):
        raise type_error(name, "a Python float (a device tensor cannot be read without a "
                         "synchronisation, which graph capture forbids)",
                         f"a tensor on {getattr(x, 'device', 'a device')}")
    expected = "a value float32 can hold (0, or 1.4e-45 to 3.4e38 in magnitude)"
    try:  # item(): NumPy 2 no longer converts a one-element array by float()
        raw = x.item() if hasattr(x, "item") else x
        # An array's element is no scale where the plain value is none: float() would parse
        # text (np.array("0.04")) and read a bool (an object array's True) as 1.
        # An object array's element may be NumPy's bool, no Python bool (its dtype says so).
        a_bool = isinstance(raw, bool) or str(getattr(raw, "dtype", "")) == "bool"
        held = a_bool or isinstance(raw, (str, bytes, bytearray))
        value = 0.0 if held else float(raw)
    except (TypeError, ValueError, RuntimeError):  # torch's item() of many elements: Runtime
        raise type_error(name, "a float", type(x).__name__) from None
    except OverflowError:
        raise value_error(name, expected, f"{type(x).__name__} past float64's range") from None
    if held:
        raise type_error(name, "a float", f"{type(x).__name__} holding "
                         f"{'a bool' if a_bool else 'a ' + type(raw).__name__}")
    # The library takes float32: a finite value past its range is refused, not made inf or 0.
    if math.isfinite(value) and value != 0 and not _FLT_TRUE_MIN <= abs(value) <= _FLT_MAX:
        raise value_error(name, expected, repr(value))
    # A Decimal, Fraction or long double below float64's range (an object that only converts
    # by __float__ compares by identity: it is taken as what it converts to).
    if value == 0 and isinstance(raw, numbers.Number) and raw != 0:
        raise value_error(name, expected, f"{type(raw).__name__} below float64's range")
    return value

