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
def test_tensorrt_plan_builds_in_every_precision_and_the_manifest_records_it(arch, timm_checkpoint, tmp_path, record_property):
    folder = timm_checkpoint(arch)
    for precision in ("fp32", "fp16", "bf16"):
        out = tmp_path / f"{arch}-{precision}.bundle"
        build_bundle(BuildRequest(model=str(folder), output=out, precision=precision, backends=("tensorrt",)),
                     progress=lambda message: None)
        bundle = read_bundle(out)
        (engine,) = bundle.engines
        record = engine.record
        assert engine.key == f"tensorrt-cuda-{precision}"
        assert record["builder"] in ("tensorrt", "tensorrt_rtx") and record["builder_version"]
        assert record["network_layers"] > 10
        assert record["plan_bytes"] == bundle.manifest["members"][f"engines/{engine.key}/engine.plan"]["size"] > 0
        record_property(f"{precision}_plan", {k: record[k] for k in ("network_layers", "plan_bytes", "build_seconds")})
        convs = record["layer_precisions"].get("CONVOLUTION", {})
        if convs:
            # Strongly typed: every convolution runs in the requested precision.
            assert set(convs) == {DTYPE[precision]}, convs
        out.unlink()  # large plans: keep the CI disk small


def test_broken_network_fails_the_build_with_the_tensorrt_error_and_leaves_no_bundle(tmp_path, monkeypatch):
    import numpy as np

    import trtmc.build
    from trtmc.backends.tensorrt import TensorRTBuildError
    from trtmc.families import find_family
    from trtmc.graph import Conv2dAttrs, DType, Graph, InputAttrs, Node, OpKind, TensorType

    from conftest import LITE0_IN_REPO

    # A graph GraphBuilder would refuse: the convolution's weight wants 5 input channels, the image
    # has 3. Graph.verify() refuses it too; switched off, only TensorRT can object, and the build
    # must surface its words and write nothing.
    monkeypatch.setattr(Graph, "verify", lambda self: None)
    nodes = [
        Node("pixels", OpKind.INPUT, (), InputAttrs(), TensorType((1, 3, 224, 224), DType.F32), "pixels"),
        Node("conv_stem", OpKind.CONV2D, ("pixels",), Conv2dAttrs("conv_stem.weight", None, (2, 2), (1, 1, 1, 1), (1, 1), 1),
             TensorType((1, 4, 112, 112), DType.F32), "conv_stem"),
    ]
    broken = Graph(nodes=nodes, weights={"conv_stem.weight": np.ones((4, 5, 3, 3), np.float32)}, outputs=["conv_stem"])
    family, _ = find_family("tf_efficientnet_lite0")
    monkeypatch.setattr(trtmc.build, "build_graph", lambda checkpoint, precision: (family, broken))
    out = tmp_path / "broken.bundle"
    with pytest.raises(TensorRTBuildError, match="kernel weights has count 180 but 108 was expected"):
        build_bundle(BuildRequest(model=str(LITE0_IN_REPO), output=out, backends=("tensorrt",)), progress=lambda m: None)
    assert not out.exists() and list(tmp_path.iterdir()) == []
