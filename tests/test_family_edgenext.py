"""EdgeNeXt: block kinds, channel chunks and heads from the tensors, the positional encoding computed once as
timm computes it, the eps and temperature the tensors cannot say, the channel attention's fp32 norms,
refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from timm.models.edgenext import PositionalEncodingFourier

from support import (
    assert_refused_before_weights_load,
    forbid_weight_reads,
    fp32_relative_error,
    reconfigured_checkpoint,
    rewritten_checkpoint,
)
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import build_graph
from trtmc.families.edgenext import FAMILY, ConvBlock, SplitTransposeBlock, derive_layout, fourier_positions
from trtmc.graph import DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "edgenext_xx_small"


def test_layout_reads_block_kinds_kernels_chunks_and_heads_from_the_tensors(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    layout = derive_layout(Checkpoint(timm_checkpoint(SMALLEST)), FAMILY.architectures[SMALLEST])
    assert layout.patch == 4 and [s.downsample for s in layout.stages] == [0, 2, 2, 2]
    kernels = [[b.kernel for b in s.blocks if isinstance(b, ConvBlock)] for s in layout.stages]
    assert kernels == [[3, 3], [5], [7] * 5, [9]]
    sdta = [b for s in layout.stages for b in s.blocks if isinstance(b, SplitTransposeBlock)]
    # x.chunk(n) gives ceil(C / n) channels to every chunk but the last: 88 -> 30, 30, 28.
    assert [(b.prefix, b.chunks, b.heads, b.positions) for b in sdta] == [
        ("stages.1.blocks.1", (24, 24), 4, True),
        ("stages.2.blocks.5", (30, 30, 28), 4, False),
        ("stages.3.blocks.1", (42, 42, 42, 42), 4, False),
    ]


def test_positional_encoding_is_timms_computed_once():
    torch.manual_seed(0)
    timm_encoding = PositionalEncodingFourier(hidden_dim=32, dim=48).eval()
    with torch.no_grad():
        expected = timm_encoding((1, 32, 24))[0].double().numpy()  # [48, 32, 24]
    weight = timm_encoding.token_projection.weight.detach().double().numpy()[:, :, 0, 0]
    bias = timm_encoding.token_projection.bias.detach().double().numpy()
    ours = np.einsum("oc,chw->ohw", weight, fourier_positions(32, 32, 24, 10000.0)) + bias[:, None, None]
    np.testing.assert_allclose(ours, expected, atol=1e-5)


def _draw_temperatures(state):
    # timm starts each head's temperature at 1 and random_weights leaves it there: draw them, so a
    # temperature applied to the wrong head would move the logits.
    generator = torch.Generator().manual_seed(0)
    for name, value in state.items():
        if name.endswith("xca.temperature"):
            state[name] = 0.5 + 2.5 * torch.rand(value.shape, generator=generator)


def test_drawn_temperatures_keep_fp32_parity_with_timm(timm_checkpoint, tmp_path, record_property):
    source = timm_checkpoint(SMALLEST)
    folder = rewritten_checkpoint(source, tmp_path / "hot", _draw_temperatures)
    error = fp32_relative_error(folder)
    record_property("fp32_rel_err", error)
    assert error <= 1e-4
    cold = FAMILY.build(Checkpoint(source))  # the test bites: the temperatures move the logits
    assert fp32_relative_error(folder, cold) > 1e-3


def test_eps_1e6_and_the_encodings_temperature_are_timms_and_others_would_move_the_logits(timm_checkpoint):
    """No tensor holds the norms' eps or PositionalEncodingFourier's temperature."""
    folder = timm_checkpoint(SMALLEST)
    arch = FAMILY.architectures[SMALLEST]
    assert (arch.norm_eps, arch.temperature) == (1e-6, 10000.0)
    assert fp32_relative_error(folder) <= 1e-4
    for other in (dataclasses.replace(arch, norm_eps=1e-5), dataclasses.replace(arch, temperature=1000.0)):
        assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), other)) > 1e-3, other


def test_fp16_attends_across_channels_in_fp16_and_keeps_the_l2_norms_in_fp32(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "fp16")
    typed = {n.name: n for n in assign_precision(graph, PrecisionPolicy("fp16")).nodes}
    attention = typed["stages.1.blocks.1.xca"]
    assert attention.kind is OpKind.ATTENTION and attention.type.dtype is DType.F16
    # 48 channels in 4 heads of 12, each channel a row over the 32x32 map's 1024 tokens.
    assert attention.type.shape == (1, 4, 12, 1024) and attention.attrs.scale == 1.0
    for leaf in ("square", "sum", "sqrt", "clamp"):
        node = typed[f"stages.1.blocks.1.xca.q_norm.{leaf}"]
        assert node.sensitive and node.type.dtype is DType.F32, leaf
    assert typed["stages.1.blocks.1.xca.q_norm"].type.dtype is DType.F32
    assert typed["stages.1.blocks.1.xca.qkv"].type.dtype is DType.F16


def test_chunks_that_x_chunk_would_not_make_are_refused(timm_checkpoint, tmp_path, monkeypatch):
    def narrow(state):
        for leaf in ("weight", "bias"):
            state[f"stages.1.blocks.1.convs.0.{leaf}"] = state[f"stages.1.blocks.1.convs.0.{leaf}"][:20]

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "narrow", narrow)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"convs\.0\.weight splits 48 channels into chunks of 20, not into 2"
    )


def test_rw_variant_that_downsamples_inside_its_blocks_is_refused(timm_checkpoint, tmp_path, monkeypatch):
    # edgenext_small_rw (downsample_block=True): no stage downsample, the first conv block of a stage
    # strides and widens instead; its stem overlaps (9x9, stride 4) and its convolutions have no biases.
    folder = reconfigured_checkpoint(timm_checkpoint("edgenext_small_rw"), tmp_path / "rw", architecture=SMALLEST)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError,
        r"'stages\.1\.blocks\.0\.conv_dw\.weight' has shape \(96, 1, 5, 5\); expected rank 4 with dim 0 = 48",
    )
