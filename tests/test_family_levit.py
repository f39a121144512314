"""LeViT: heads, widths and token grids from the tensors, attention biases gathered as timm gathers them,
the activation the tensors cannot name, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import timm
import torch

from support import (
    assert_refused_before_weights_load,
    forbid_weight_reads,
    fp32_relative_error,
    reconfigured_checkpoint,
    rewritten_checkpoint,
)
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.levit import FAMILY, derive_layout, relative_position_bias
from trtmc.graph import Activation, DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "levit_128s"
# Statistics measured on 64 noise images keep random LeViT weights out of chaos (CALIBRATED_ON in
# test_parity_every_architecture.py says why); the fp32 comparisons here need that.
CALIBRATION_IMAGES = 64


def test_layout_reads_heads_widths_and_token_grids_from_the_tensors(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    layout = derive_layout(Checkpoint(timm_checkpoint(SMALLEST)), FAMILY.architectures[SMALLEST])
    assert layout.stem == ("stem.conv1", "stem.conv2", "stem.conv3", "stem.conv4") and layout.resolution == 14
    rows = [(b.prefix, b.attention.heads, b.attention.key_dim, b.attention.value_dim, b.attention.resolution,
             b.attention.query_resolution, b.hidden) for b in layout.blocks]
    assert rows == [
        ("stages.0.blocks.0", 4, 16, 32, 14, 14, 256),
        ("stages.0.blocks.1", 4, 16, 32, 14, 14, 256),
        # levit_128s: num_heads (4, 6, 8); a downsample has in_dim // key_dim heads and values 4x the keys.
        ("stages.1.downsample", 8, 16, 64, 14, 7, 512),
        *[(f"stages.1.blocks.{j}", 6, 16, 32, 7, 7, 512) for j in range(3)],
        ("stages.2.downsample", 16, 16, 64, 7, 4, 768),  # 7 -> 4: an odd grid keeps its last row
        *[(f"stages.2.blocks.{j}", 8, 16, 32, 4, 4, 768) for j in range(4)],
    ]
    assert [b.residual for b in layout.blocks].count(False) == 2


def test_attention_biases_are_gathered_as_timms_attention_bias_idxs():
    model = timm.create_model(SMALLEST).eval()
    for attention in (model.stages[0].blocks[0].attn, model.stages[2].downsample.attn_downsample):
        with torch.no_grad():
            attention.attention_biases.normal_()
            expected = attention.get_attention_biases(torch.device("cpu")).numpy()
        stride = getattr(attention, "stride", 1)
        gathered = relative_position_bias(attention.attention_biases.detach().numpy(), attention.resolution[0], stride)
        assert gathered.shape == (1, *expected.shape)
        np.testing.assert_array_equal(gathered[0], expected)


def _without_attention_biases(state):
    state.update({name: 0 * value for name, value in state.items() if name.endswith("attention_biases")})


def test_the_fp32_check_sees_the_attention_biases(timm_checkpoint, tmp_path):
    # timm starts attention biases at 0; random_weights draws them, so that a bias gathered into the
    # wrong query or key moves the logits the every-architecture check compares.
    folder = timm_checkpoint(SMALLEST, calibration_images=CALIBRATION_IMAGES)
    unbiased = rewritten_checkpoint(folder, tmp_path / "unbiased", _without_attention_biases)
    assert fp32_relative_error(folder) <= 1e-4
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(unbiased))) > 1e-2


def test_hard_swish_is_levits_activation_and_silu_would_move_the_logits(timm_checkpoint):
    """levit_128s and levit_384_s8 hold the same kinds of tensors; only the ArchConfig says hard-swish or SiLU."""
    folder = timm_checkpoint(SMALLEST, calibration_images=CALIBRATION_IMAGES)
    arch = FAMILY.architectures[SMALLEST]
    assert arch.act is Activation.HARD_SWISH
    silu = FAMILY.build(Checkpoint(folder), dataclasses.replace(arch, act=Activation.SILU))
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder))) <= 1e-4
    assert fp32_relative_error(folder, silu) > 1e-2


def test_fp16_runs_each_attention_in_fp16_with_values_wider_than_keys(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "fp16")
    typed = {n.name: n for n in assign_precision(graph, PrecisionPolicy("fp16")).nodes}
    attention = typed["stages.1.downsample.attn_downsample"]
    assert attention.kind is OpKind.ATTENTION and attention.type.dtype is DType.F16
    q, k, v = (typed[name].type.shape for name in attention.inputs)
    assert (q, k, v) == ((1, 8, 49, 16), (1, 8, 196, 16), (1, 8, 196, 64))  # 14x14 keys, 7x7 queries
    assert attention.attrs.scale == 16**-0.5
    assert graph.weights[attention.attrs.bias].shape == (1, 8, 49, 196)
    assert not any(n.kind in (OpKind.SOFTMAX, OpKind.MATMUL) for n in graph.nodes)


def test_conv_mode_checkpoint_is_refused_by_its_4d_linears(timm_checkpoint, tmp_path, monkeypatch):
    # timm's levit_conv_* models hold the same modules as 1x1 convolutions; trtmc serves the linear mode.
    folder = reconfigured_checkpoint(timm_checkpoint("levit_conv_128s"), tmp_path / "conv", architecture=SMALLEST)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError,
        r"'stages\.0\.blocks\.0\.attn\.proj\.ln\.linear\.weight' has shape \(128, 128, 1, 1\); expected rank 2",
    )


def test_other_input_size_is_refused_without_resampling_attention_biases(timm_checkpoint, tmp_path, monkeypatch):
    folder = reconfigured_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "256", input_size=256)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel,
        r"stages\.0\.blocks\.0\.attn\.attention_biases \(4, 196\) has 196 positions.*16x16 token grid",
    )
