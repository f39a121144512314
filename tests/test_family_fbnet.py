"""FBNet-C: a ReLU network whose expansion-1 first block adds its input, an EfficientNet head, a
MobileNetV3-style head bias refused before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

import torch

from support import assert_refused_before_weights_load, fp32_relative_error, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint
from trtmc.families import UnsupportedModel
from trtmc.families.efficientnet import BlockKind
from trtmc.families.fbnet import ARCHITECTURES, FAMILY, derive_layout
from trtmc.graph import Activation

ARCH = "fbnetc_100"


def test_first_block_expands_by_one_and_adds_its_input(timm_checkpoint):
    layout = derive_layout(Checkpoint(timm_checkpoint(ARCH)), ARCHITECTURES[ARCH])
    first = layout.blocks[0]
    assert (first.kind, first.in_width, first.out_width, first.skip) == (BlockKind.INVERTED_RESIDUAL, 16, 16, True)
    assert not any(b.se for b in layout.blocks) and layout.head_width == 1984


def test_network_runs_on_relu(timm_checkpoint):
    """timm's EfficientNet class defaults to ReLU and fbnetc_100 keeps it: SiLU moves the logits."""
    folder = timm_checkpoint(ARCH)
    swish = dataclasses.replace(ARCHITECTURES[ARCH], act=Activation.SILU)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), swish)) > 1e-2


def test_a_conv_head_bias_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    """FBNet's head is EfficientNet's, conv_head then bn2: a bias there belongs to another head."""
    def add_bias(state):
        state["conv_head.bias"] = torch.zeros(1984)

    folder = rewritten_checkpoint(timm_checkpoint(ARCH), tmp_path / "f", add_bias)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"fbnetc_100: the checkpoint holds tensors this layout does not use: conv_head\.bias"
    )
