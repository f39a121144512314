"""What every family refuses the same way: a checkpoint that lacks a tensor its layout needs.

The refusals only a family has (a mis-shaped block, a foreign variant's extra tensors) are in its
test_family_*.py file.
"""

from __future__ import annotations

import re

import pytest

from support import assert_refused_before_weights_load, rewritten_checkpoint
from trtmc.checkpoint import CheckpointError
from trtmc.families import all_families

# One tensor deep inside a checkpoint of each family: a norm's statistic or bias that the layout can
# only find missing when it asks for the tensor by name, not from the block structure around it.
MISSING_TENSOR = {
    "efficientnet": ("tf_efficientnet_lite0", "blocks.2.1.bn2.running_var"),
    "ghostnet": ("ghostnet_050", "blocks.6.3.ghost2.cheap_operation.1.running_var"),
    "mobilenetv3": ("mobilenetv3_small_100", "blocks.3.1.bn2.running_var"),
    "dpn": ("dpn68", "features.conv4_7.c3x3_b.bn.running_var"),
    "resnet": ("resnet18", "layer3.1.bn2.running_var"),
    "regnet": ("regnetx_002", "s2.b1.downsample.bn.running_var"),
    "convnext": ("convnext_atto", "stages.2.blocks.3.norm.bias"),
    "vit": ("vit_tiny_patch16_224", "blocks.7.norm2.bias"),
    "efficientvit": ("efficientvit_b0", "stages.3.blocks.1.context_module.main.proj.norm.running_var"),
    "levit": ("levit_128s", "stages.1.blocks.2.mlp.ln2.bn.running_var"),
    "efficientformer": ("efficientformer_l1", "stages.2.blocks.4.mlp.norm2.running_var"),
    "mobilevit": ("mobilevit_xxs", "stages.3.1.transformer.2.norm2.bias"),
    "edgenext": ("edgenext_xx_small", "stages.2.blocks.5.norm_xca.bias"),
}


@pytest.mark.parametrize("family", [family.name for family in all_families()])
def test_a_missing_tensor_is_refused_by_name_before_weights_load(family, timm_checkpoint, tmp_path, monkeypatch):
    arch, name = MISSING_TENSOR[family]
    folder = rewritten_checkpoint(timm_checkpoint(arch), tmp_path / arch, lambda state: state.pop(name))
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, rf"tensor '{re.escape(name)}' is missing for {arch}"
    )
