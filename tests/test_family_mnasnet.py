"""MnasNet: skips exactly where timm's blocks skip (its `noskip` tokens), ReLU squeeze-excite, a checkpoint
of another stage count refused before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

from support import assert_refused_before_weights_load, fp32_relative_error, load_timm, reconfigured_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families.efficientnet import decode_stages
from trtmc.families.mnasnet import ARCHITECTURES, FAMILY, derive_layout
from trtmc.graph import Activation

SMALLEST = "mnasnet_small"


def test_blocks_add_their_input_exactly_where_timms_do(timm_checkpoint):
    for arch, config in ARCHITECTURES.items():
        folder = timm_checkpoint(arch)
        layout = derive_layout(Checkpoint(folder), config)
        timm_blocks = [block for stage in load_timm(folder).blocks for block in stage]
        assert [b.skip for b in layout.blocks] == [b.has_skip for b in timm_blocks], arch


def test_small_models_first_block_adds_its_input(timm_checkpoint):
    """mnasnet_small's first block maps 8 channels to 8 and, unlike B1's and A1's, is not `noskip`."""
    folder = timm_checkpoint(SMALLEST)
    assert derive_layout(Checkpoint(folder), ARCHITECTURES[SMALLEST]).blocks[0].skip
    noskip = dataclasses.replace(ARCHITECTURES[SMALLEST], stages=decode_stages("s1_noskip s2 s2 s2 s1 s2 s1"))
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), noskip)) > 1e-2


def test_squeeze_excite_uses_relu_inside_and_a_sigmoid_gate(timm_checkpoint):
    folder = timm_checkpoint("semnasnet_100")
    graph = FAMILY.build(Checkpoint(folder), ARCHITECTURES["semnasnet_100"])
    assert graph.node("blocks.2.0.se.act1").attrs.fn is Activation.RELU
    assert graph.node("blocks.2.0.se.gate").attrs.fn is Activation.SIGMOID
    hard_gate = dataclasses.replace(ARCHITECTURES["semnasnet_100"], se_gate=Activation.HARD_SIGMOID)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), hard_gate)) > 1e-2


def test_six_stage_tensors_under_a_mnasnet_name_are_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    folder = reconfigured_checkpoint(timm_checkpoint("mixnet_s"), tmp_path / "mixnet", architecture=SMALLEST)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError,
        r"mnasnet_small: the checkpoint has blocks\.<stage> indices \[0, 1, 2, 3, 4, 5\], but mnasnet_small has 7 stages",
    )
