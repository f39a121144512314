"""HardCoReNAS: MobileNetV3-Large's stages, activations and squeeze-excite, each variant's blocks and SE
placement from its tensors.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

from support import fp32_relative_error
from trtmc.checkpoint import Checkpoint
from trtmc.families import mobilenetv3
from trtmc.families.hardcorenas import ARCHITECTURES, FAMILY, derive_layout
from trtmc.graph import Activation

SMALLEST = "hardcorenas_b"


def test_variants_differ_only_in_their_tensors(timm_checkpoint):
    assert set(ARCHITECTURES.values()) == {mobilenetv3.ARCHITECTURES["mobilenetv3_large_100"]}
    a = derive_layout(Checkpoint(timm_checkpoint("hardcorenas_a")), ARCHITECTURES["hardcorenas_a"])
    b = derive_layout(Checkpoint(timm_checkpoint(SMALLEST)), ARCHITECTURES[SMALLEST])
    # The search put SE in the second block of stage 1 of both, and B gives stage 1 a third block.
    assert [x.prefix for x in a.blocks if x.prefix.startswith("blocks.1.")] == ["blocks.1.0", "blocks.1.1"]
    assert [x.se for x in b.blocks if x.prefix.startswith("blocks.1.")] == [False, True, False]
    assert [x.se for x in a.blocks if x.prefix.startswith("blocks.1.")] == [False, True]


def test_early_stages_run_on_relu(timm_checkpoint):
    folder = timm_checkpoint(SMALLEST)
    graph = FAMILY.build(Checkpoint(folder), ARCHITECTURES[SMALLEST])
    assert graph.node("blocks.2.0.bn1.act").attrs.fn is Activation.RELU
    assert graph.node("blocks.3.0.bn1.act").attrs.fn is Activation.HARD_SWISH
    hard_swish = dataclasses.replace(
        ARCHITECTURES[SMALLEST], stages=tuple(dataclasses.replace(s, act=None) for s in ARCHITECTURES[SMALLEST].stages)
    )
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), hard_swish)) > 1e-2

