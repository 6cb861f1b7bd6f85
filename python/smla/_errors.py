"""Errors raised in Python look like the C++ ones: "smla: <argument>: expected X, got Y",
with the parts as attributes (argument, expected, got), so callers handle both alike."""


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
