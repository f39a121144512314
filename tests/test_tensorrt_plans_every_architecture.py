"""CI builds a real TensorRT-RTX plan for every architecture `trtmc families` lists, in every precision.

A plan cannot be deserialized without a GPU, so these tests check what the CPU can see: the build
succeeded, and the bundle's manifest records the plan (network layer count, plan size, builder and
version, per-kind layer precisions that match the requested precision).
"""

from __future__ import annotations

import pytest

from trtmc.build import BuildRequest, build_bundle
from trtmc.bundle import read_bundle
from trtmc.families import all_families

ARCHITECTURES = [arch for family in all_families() for arch in family.architectures]
DTYPE = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tensorrt_plan_builds_in_every_precision_and_the_manifest_records_it(arch, timm_checkpoint, tmp_path):
    folder = timm_checkpoint(arch)
    for precision in ("fp32", "fp16", "bf16"):
        out = tmp_path / f"{arch}-{precision}.bundle"
        build_bundle(BuildRequest(model=str(folder), output=out, precision=precision, backends=("tensorrt",)),
                     progress=lambda message: None)
        bundle = read_bundle(out)
        (engine,) = bundle.engines
        record = engine["record"]
        assert engine["key"] == f"tensorrt-cuda-{precision}"
        assert record["builder"] in ("tensorrt", "tensorrt_rtx") and record["builder_version"]
        assert record["network_layers"] > 10
        assert record["plan_bytes"] == bundle.manifest["members"][f"engines/{engine['key']}/engine.plan"]["size"] > 0
        convs = record["layer_precisions"].get("CONVOLUTION", {})
        if convs:
            # Strongly typed: every convolution runs in the requested precision.
            assert set(convs) == {DTYPE[precision]}, convs
        out.unlink()  # large plans: keep the CI disk small
