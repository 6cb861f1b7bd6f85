"""The small step both test files run: four layers on two SWA groups, SWA-only in each, then a
run of one ratio-4 key (index and kv source: layer 2) across both groups."""

import smla


def four_layers(heads):
    return [smla.LayerSpec(layer=0, swa_group=0, num_heads=heads),
            smla.LayerSpec(layer=1, swa_group=1, num_heads=heads),
            smla.LayerSpec(layer=2, swa_group=0, compress_ratio=4, kv_source=2, index_source=2,
                           index_topk=12, num_heads=heads),
            smla.LayerSpec(layer=3, swa_group=1, compress_ratio=4, kv_source=2, index_source=2,
                           index_topk=12, num_heads=heads)]
