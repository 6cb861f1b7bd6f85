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


def shape_text(shape) -> str:
    """A shape as the C++ messages write it: [2, 2, 64]."""
    return "[" + ", ".join(str(int(n)) for n in shape) + "]"


def raise_renamed(error, names: dict, shapes: dict = None):
    """Raises `error`, caught from a call that a wrapper made, with its arguments renamed as the
    wrapper's caller spelled them (`names`: the call's name -> the caller's) wherever its
    argument, expected or got names one, and, for an argument the wrapper reshaped (`shapes`:
    the call's name -> (the shape the call saw, as shape_text writes it; what the caller passed,
    in words)), a got that starts with the shape seen starting with those words instead; as it
    was (cause and traceback kept) where none of that applies or it is not an smla error. Call
    it in the `except` block."""
    parts = [getattr(error, part, None) for part in ("argument", "expected", "got")]
    if all(isinstance(part, str) for part in parts):
        spelled = list(parts)
        seen, passed = (shapes or {}).get(parts[0], (None, None))
        if seen is not None and parts[2].startswith(seen):
            spelled[2] = passed + parts[2][len(seen):]
        if names:
            name = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, names)) + r")(?!\w)")
            spelled = [name.sub(lambda m: names[m.group(1)], part) for part in spelled]
        if spelled != parts:
            raise _error(type(error), *spelled) from None
    raise error
