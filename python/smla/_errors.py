"""Errors raised in Python look like the C++ ones: "smla: <argument>: expected X, got Y",
with the parts as attributes (argument, expected, got), so callers handle both alike."""

import re


def _error(cls, argument, expected, got):
    err = cls(f"smla: {argument}: expected {expected}, got {got}")
    err.argument, err.expected, err.got = argument, expected, got
    return err


def type_error(argument, expected, got):
    return _error(TypeError, argument, expected, got)


def value_error(argument, expected, got):
    return _error(ValueError, argument, expected, got)


def import_error(argument, expected, got):
    return _error(ImportError, argument, expected, got)


def runtime_error(argument, expected, got):
    return _error(RuntimeError, argument, expected, got)


def raise_renamed(error, names: dict):
    """Raises `error`, caught from a call that a wrapper made, with its arguments renamed as the
    wrapper's caller spelled them (`names`: the call's name -> the caller's) wherever its
    argument, expected or got names one; as it was (cause and traceback kept) where it names
    none or is not an smla error. Call it in the `except` block."""
    parts = [getattr(error, part, None) for part in ("argument", "expected", "got")]
    if all(isinstance(part, str) for part in parts):
        name = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, names)) + r")(?!\w)")
        spelled = [name.sub(lambda m: names[m.group(1)], part) for part in parts]
        if spelled != parts:
            raise _error(type(error), *spelled) from None
    raise error
