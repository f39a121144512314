"""The shared layout reader every family derives its layout through: block numbering, conv widths,
classifier width, tensors nothing placed.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import save_file

from support import assert_refused_before_weights_load, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel
from trtmc.families._layout import LayoutReader, indexed_blocks


def _checkpoint(folder, shapes: dict[str, tuple[int, ...]], num_classes: int = 10) -> Checkpoint:
    """A checkpoint holding zero tensors of these names and shapes."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architecture": "toy_net", "num_classes": num_classes}))
    save_file({name: torch.zeros(shape) for name, shape in shapes.items()}, str(folder / "model.safetensors"))
    return Checkpoint(folder)


def test_indexed_blocks_refuses_a_gap_naming_the_pattern_and_indices(tmp_path):
    ckpt = _checkpoint(tmp_path / "gap", {f"blocks.{i}.weight": (4,) for i in (0, 1, 3)})
    pattern = r"^blocks\.(\d+)\."
    with pytest.raises(CheckpointError, match=rf"toy_net: the indices \[0, 1, 3\] .*{re.escape(pattern)}"):
        indexed_blocks(ckpt, pattern)


def test_indexed_blocks_numbers_every_level_from_its_own_start(tmp_path):
    # DPN's numbering: stages from 2 (conv1 is the stem), blocks from 1.
    pattern = r"^features\.conv(\d+)_(\d+)\."
    names = ["conv2_1", "conv2_2", "conv3_1", "conv3_2"]
    dpn = _checkpoint(tmp_path / "dpn", {f"features.{n}.weight": (4,) for n in names})
    assert indexed_blocks(dpn, pattern, start=(2, 1)) == [(2, 1), (2, 2), (3, 1), (3, 2)]
    with pytest.raises(CheckpointError, match=r"the indices \[2, 3\] in .* are not contiguous from 0"):
        indexed_blocks(dpn, pattern)
    gap = _checkpoint(tmp_path / "gap", {f"features.{n}.weight": (4,) for n in ["conv2_1", "conv3_1", "conv3_3"]})
    with pytest.raises(CheckpointError, match=r"the indices \[1, 3\] under 3 in .* are not contiguous from 1"):
        indexed_blocks(gap, pattern, start=(2, 1))


def test_a_gap_between_a_family_checkpoints_blocks_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def renumber(state):
        for name in [n for n in state if n.startswith("layer2.1.")]:
            state[name.replace("layer2.1.", "layer2.2.")] = state.pop(name)

    folder = rewritten_checkpoint(timm_checkpoint("resnet18"), tmp_path / "r18", renumber)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"resnet18: the indices \[0, 2\] under 2 in the tensor names matching"
    )


def test_conv_must_read_a_width_its_groups_divide(tmp_path):
    read = LayoutReader(_checkpoint(tmp_path / "conv", {"grouped.weight": (64, 8, 3, 3), "grouped.bias": (64,)}))
    assert read.conv("grouped", 32) == 64  # 4 groups of 8 channels
    assert read.expected == {"grouped.weight": (64, 8, 3, 3), "grouped.bias": (64,)}
    with pytest.raises(CheckpointError, match=r"'grouped\.weight' has shape \(64, 8, 3, 3\), which cannot be a conv reading 12"):
        read.conv("grouped", 12)


def test_classifier_is_checked_against_config_num_classes(tmp_path):
    read = LayoutReader(_checkpoint(tmp_path / "head", {"fc.weight": (1000, 16)}, num_classes=10))
    with pytest.raises(CheckpointError, match=r"fc\.weight \(1000, 16\) does not classify into config\.json's num_classes=10"):
        read.classifier("fc", 16)


def test_finish_refuses_tensors_the_layout_did_not_place(tmp_path):
    read = LayoutReader(_checkpoint(tmp_path / "extra", {"fc.weight": (10, 16), "fc.scale": (10,)}))
    read.classifier("fc", 16, bias=False)
    with pytest.raises(UnsupportedModel, match=r"toy_net: the checkpoint holds tensors this layout does not use: fc\.scale \(10,\)"):
        read.finish()


def test_indexed_blocks_refuses_another_stage_count_as_a_variant_it_does_not_serve(tmp_path):
    ckpt = _checkpoint(tmp_path / "three", {f"layer{s}.0.weight": (4,) for s in (1, 2, 3)})
    assert indexed_blocks(ckpt, r"^layer(\d+)\.(\d+)\.", start=(1, 0), stages=3) == [(1, 0), (2, 0), (3, 0)]
    with pytest.raises(UnsupportedModel, match=r"toy_net: expected 4 stages .*, the checkpoint has 3: \[1, 2, 3\]"):
        indexed_blocks(ckpt, r"^layer(\d+)\.(\d+)\.", start=(1, 0), stages=4)
