"""Calls that torch.compile traces become torch.ops.smla operators (smla.torch_ops): a trace
cannot enter DLPack, and it keeps an operator as one node that writes what its schema says."""

import functools
import sys


def _torch_compiling() -> bool:
    torch = sys.modules.get("torch")  # never imports it
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return is_compiling is not None and is_compiling()


def _op_values(arguments: dict, scalars: tuple) -> bool:
    """Whether the arguments fit an operator's schema: `scalars` Python numbers, the rest torch
    tensors or None (not a `with_dtype` view, a NumPy or CuPy array, nor a tensor scale)."""
    torch = sys.modules["torch"]
    return all(isinstance(v, (bool, int, float)) if k in scalars else
               v is None or isinstance(v, torch.Tensor) for k, v in arguments.items())


def as_torch_op(name: str, op_arguments, scalars: tuple):
    """Decorates a keyword-only function: traced by torch.compile with no `stream`, and with
    `op_arguments(kwargs)` values that torch.ops.smla.<name> takes (`scalars` its numbers), a
    call is that operator's, whose implementation is the undecorated function (`__wrapped__`);
    any other traced call runs the function eagerly (a graph break), and untraced calls run it."""
    def decorate(fn):
        @functools.wraps(fn)
        def call(**kwargs):
            if not _torch_compiling():
                return fn(**kwargs)
            arguments = op_arguments(kwargs)
            if kwargs.get("stream") is None and _op_values(arguments, scalars):
                from . import torch_ops  # registers the operators
                # By position up to the first absent one: dynamo refuses a non-contiguous tensor
                # passed as `out=`, which the op takes (the heads of a wider buffer).
                args = []
                for parameter in torch_ops.POSITIONAL[name]:
                    if parameter not in arguments:
                        break
                    args.append(arguments.pop(parameter))
                return getattr(torch_ops, name)(*args, **arguments)
            # Run eagerly, outside the trace (a graph break): tracing DLPack fails.
            return sys.modules["torch"].compiler.disable(fn)(**kwargs)
        return call
    return decorate
