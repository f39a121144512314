"""EfficientFormer: where attention starts and its shapes from the tensors, timm's own bias table, the pool
size the tensors cannot say, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from support import (
    assert_refused_before_weights_load,
    forbid_weight_reads,
    fp32_relative_error,
    reconfigured_checkpoint,
    rewritten_checkpoint,
)
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families.efficientformer import FAMILY, AttentionBlock, PoolBlock, derive_layout
from trtmc.families.levit import relative_position_bias

SMALLEST = "efficientformer_l1"


def test_layout_reads_where_attention_starts_and_its_shapes_from_the_tensors(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    for arch, pooling, attending in (("efficientformer_l1", 3, 1), ("efficientformer_l3", 2, 4)):
        layout = derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])
        *convolutional, last = layout.stages
        assert all(isinstance(b, PoolBlock) for stage in convolutional for b in stage.blocks)
        kinds = [type(b) for b in last.blocks]
        assert kinds == [PoolBlock] * pooling + [AttentionBlock] * attending, arch
        # timm's Flat takes the number between the two kinds of block.
        assert last.blocks[pooling].prefix == f"stages.3.blocks.{pooling + 1}"
        attention = last.blocks[-1]
        assert (attention.heads, attention.key_dim, attention.value_dim, attention.resolution) == (8, 32, 128, 7)
        assert [s.downsample for s in layout.stages] == [False, True, True, True]


def test_the_bias_table_gathered_is_the_one_timm_stores(timm_checkpoint):
    ckpt = Checkpoint(timm_checkpoint(SMALLEST))
    stored = ckpt.tensor("stages.3.blocks.4.token_mixer.attention_bias_idxs")
    positions = np.arange(49, dtype=np.float32)[None]  # one head whose bias at each position is its index
    np.testing.assert_array_equal(relative_position_bias(positions, 7)[0, 0], stored)


def _without_attention_biases(state):
    state.update({name: 0 * value for name, value in state.items() if name.endswith("attention_biases")})


def test_the_fp32_check_sees_the_attention_biases(timm_checkpoint, tmp_path):
    # timm starts attention biases at 0; random_weights draws them, so that a bias gathered into the
    # wrong query or key moves the logits the every-architecture check compares.
    folder = timm_checkpoint(SMALLEST)
    unbiased = rewritten_checkpoint(folder, tmp_path / "unbiased", _without_attention_biases)
    assert fp32_relative_error(folder) <= 1e-4
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(unbiased))) > 5e-4  # 5x the check's bound


def test_pool_size_3_is_timms_and_5_would_move_the_logits(timm_checkpoint):
    """No tensor holds the pooling token mixer's window; EfficientFormer's default pool_size is 3."""
    folder = timm_checkpoint(SMALLEST)
    arch = FAMILY.architectures[SMALLEST]
    assert arch.pool_size == 3
    wider = FAMILY.build(Checkpoint(folder), dataclasses.replace(arch, pool_size=5))
    assert wider.node("stages.0.blocks.0.token_mixer.pool").attrs.kernel == (5, 5)
    assert fp32_relative_error(folder) <= 1e-4
    assert fp32_relative_error(folder, wider) > 1e-2


def test_blocks_numbered_without_timms_flat_are_refused(timm_checkpoint, tmp_path, monkeypatch):
    def close_the_gap(state):
        for name in [n for n in state if n.startswith("stages.3.blocks.4.")]:
            state[name.replace("blocks.4.", "blocks.3.")] = state.pop(name)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "gapless", close_the_gap)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"stages\.3\.blocks are numbered \[0, 1, 2, 3\].*\[0, 1, 2, 4\]"
    )


def test_efficientformer_v2_checkpoint_is_refused(timm_checkpoint, tmp_path, monkeypatch):
    # EfficientFormerV2 is another design (timm's efficientformer_v2.py) under similar names.
    folder = reconfigured_checkpoint(timm_checkpoint("efficientformerv2_s0"), tmp_path / "v2", architecture=SMALLEST)
    assert_refused_before_weights_load(folder, monkeypatch, CheckpointError, r"tensor 'stem\.conv1\.weight' is missing")
