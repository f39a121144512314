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

# One tensor deep inside a checkpoint of each family: a norm's statistic or bias (a conv's gain where
# there are no norms) that the layout can only find missing when it asks for the tensor by name, not
# from the block structure around it.
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
    "efficientnetv2": ("tf_efficientnetv2_b0", "blocks.2.1.bn2.running_var"),
    "mixnet": ("mixnet_s", "blocks.3.1.bn2.running_var"),
    "mnasnet": ("mnasnet_small", "blocks.4.1.bn2.running_var"),
    "fbnet": ("fbnetc_100", "blocks.3.2.bn3.running_var"),
    "lcnet": ("lcnet_050", "blocks.4.2.bn2.running_var"),
    "hardcorenas": ("hardcorenas_b", "blocks.3.2.bn2.running_var"),
    "mobilenetv4": ("mobilenetv4_conv_small_050", "blocks.3.1.dw_mid.bn.running_var"),
    "resnetv2": ("resnetv2_18", "stages.2.blocks.1.norm2.running_var"),
    "res2net": ("res2next50", "layer3.2.bns.1.running_var"),
    "skresnet": ("skresnet18", "layer3.1.conv1.paths.1.bn.running_var"),
    "resnest": ("resnest14d", "layer3.0.conv2.bn1.running_var"),
    # Normalizer-free: a conv's gain is what the layout finds missing only by name.
    "nfnet": ("eca_nfnet_l0", "stages.2.3.conv2b.gain"),
    "swin": ("swin_tiny_patch4_window7_224", "layers.2.blocks.4.norm2.bias"),
    "beit": ("beit_base_patch16_224", "blocks.7.norm2.bias"),
    "densenet": ("densenet121", "features.denseblock3.denselayer17.norm2.running_var"),
    "inception_v3": ("inception_v3", "Mixed_6c.branch7x7dbl_4.bn.running_var"),
    "xception": ("xception41", "blocks.7.stack.conv2.bn_dw.running_var"),
    "cspnet": ("cspresnext50", "stages.2.blocks.3.conv2.bn.running_var"),
    "repvgg": ("repvgg_a0", "stages.2.9.identity.running_var"),
    "mobileone": ("mobileone_s1", "stages.2.6.conv_scale.bn.running_var"),
    "levit": ("levit_128s", "stages.1.blocks.2.mlp.ln2.bn.running_var"),
    "efficientformer": ("efficientformer_l1", "stages.2.blocks.4.mlp.norm2.running_var"),
    "mobilevit": ("mobilevit_xxs", "stages.3.1.transformer.2.norm2.bias"),
    "edgenext": ("edgenext_xx_small", "stages.2.blocks.5.norm_xca.bias"),
    "fastvit": ("fastvit_t8", "stages.2.blocks.3.token_mixer.mixer.conv_scale.bn.running_var"),
    "swinv2": ("swinv2_tiny_window8_256", "layers.2.blocks.3.attn.v_bias"),
}


@pytest.mark.parametrize("family", [family.name for family in all_families()])
def test_a_missing_tensor_is_refused_by_name_before_weights_load(family, timm_checkpoint, tmp_path, monkeypatch):
    arch, name = MISSING_TENSOR[family]
    folder = rewritten_checkpoint(timm_checkpoint(arch), tmp_path / arch, lambda state: state.pop(name))
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, rf"tensor '{re.escape(name)}' is missing for {arch}"
    )
