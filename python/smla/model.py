"""The model description (smla/model.h, smla/tables.h): presets, their layers, a layer's top-k
width and table key, each argument checked by name as the calls' are."""

from . import _smla
from ._arrays import instance, integer, utf8


def model_preset(name: str) -> "_smla.ModelPreset":
    """The preset named `name` ("v4-flash", "v4-pro", "v41-flash"); ValueError for another."""
    return _smla.model_preset(utf8(instance(name, str, "name")))


def model_layers(preset, num_swa_groups: int, with_mtp: bool = False) -> list:
    """`preset`'s layers in model order, layer l in SWA group l % num_swa_groups; with_mtp adds
    its multi-token-prediction layers."""
    return _smla.model_layers(instance(preset, _smla.ModelPreset, "preset"),
                              integer(num_swa_groups, "num_swa_groups"),
                              instance(with_mtp, bool, "with_mtp"))


def topk_width(layer, max_seq_len: int) -> int:
    """Columns of the top-k `layer` reads for KV lengths up to max_seq_len (0: SWA-only)."""
    return _smla.topk_width(instance(layer, _smla.LayerSpec, "layer"),
                            integer(max_seq_len, "max_seq_len", 64))


def sparse_index_key(layer, sharing=_smla.TableSharing.shared) -> str:
    """The key of `layer`'s table (SPEC §5): layers of equal keys in a group share it."""
    return _smla.sparse_index_key(instance(layer, _smla.LayerSpec, "layer"),
                                  instance(sharing, _smla.TableSharing, "sharing"))
