from __future__ import annotations

import pytest

from trtmc.random_weights import CALIBRATION_IMAGES, BatchNormStatistics, RandomWeights, save_random_checkpoint


@pytest.fixture(scope="session")
def timm_checkpoint(tmp_path_factory):
    """`timm_checkpoint("ghostnet_100")` -> folder with random weights (batch-norm statistics calibrated on
    noise) in the HF layout, cached per session. Keywords: `seed`, `statistics` (a BatchNormStatistics),
    `calibration_images` (how many noise images), and anything else for `timm.create_model`."""
    cache: dict[tuple, object] = {}

    def make(
        arch: str, *, seed: int = 0, statistics=BatchNormStatistics.CALIBRATED, calibration_images=CALIBRATION_IMAGES,
        **timm_kwargs,
    ):
        weights = RandomWeights(seed, statistics, calibration_images)
        key = (arch, weights, repr(sorted(timm_kwargs.items())))
        if key not in cache:
            folder = tmp_path_factory.mktemp(arch.replace("/", "_"))
            cache[key] = save_random_checkpoint(arch, folder, weights, **timm_kwargs)
        return cache[key]

    return make


REPO = __import__("pathlib").Path(__file__).resolve().parents[1]
LITE0_IN_REPO = REPO / "examples" / "checkpoints" / "tf_efficientnet_lite0.in1k"


def run_cli(*args, check=True):
    """Run the `trtmc` command's main() in this process (what the console script calls).

    Returns an object with returncode, stdout and stderr, like subprocess.run.
    """
    import contextlib
    import io
    import types

    from trtmc.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse errors and --help
            code = exc.code if isinstance(exc.code, int) else 1
    result = types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
    if check and result.returncode != 0:
        raise AssertionError(f"trtmc {' '.join(map(str, args))} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="session")
def lite0_bundle(tmp_path_factory):
    """The repo's real tf_efficientnet_lite0 checkpoint built on the CPU (fp32) with the CLI, once."""
    path = tmp_path_factory.mktemp("bundles") / "lite0.bundle"
    run_cli("build", LITE0_IN_REPO, "-o", path, "-q")
    return path


@pytest.fixture(scope="session")
def lite0_reference_bundle(tmp_path_factory):
    """The real lite0 checkpoint as a reference-engine bundle serving batches of up to 4 (nothing to
    compile): what the pipeline and `trtmc classify` tests run."""
    from trtmc.build import BuildRequest, build_bundle

    path = tmp_path_factory.mktemp("bundles") / "lite0-reference.bundle"
    build_bundle(BuildRequest(model=str(LITE0_IN_REPO), output=path, backends=("reference",), max_batch=4),
                 progress=lambda message: None)
    return path


# ---- three lanes ------------------------------------------------------------------------------------
# `pytest -m "not slow"` runs every module in a few minutes. The README's test command (what CI runs) adds
# what is marked slow here: compiled engines (an AOTInductor CPU build takes a minute), the fp32 parity of
# every architecture beyond the smallest of each family, TensorRT-RTX plans in three precisions for the
# smallest architecture of every family, and photo checks in fp16/bf16 for every family.
# `pytest --every-architecture` adds the plans of every other architecture (minutes more per family).
FAST_PLANS = ("tf_efficientnet_lite0", "vit_tiny_patch16_224")
FAST_PHOTO_CHECKS = ("resnet",)
COMPILED_FIXTURES = ("lite0_bundle",)
# Tests that each cost minutes on a 2-core machine, for what other fast tests already cover.
SLOW_TESTS = (
    "test_photo_checks_name_the_smallest_architecture_of_every_family",  # a checkpoint of every architecture
    "test_real_lite0_weights_keep_top1_in_fp16_and_bf16",  # fp16/bf16 convolutions on the CPU, 22 photos
    "test_quantized_lite0_keeps_the_fp32_top1_of_the_photos",
    "test_calibration_reads_every_photo_and_every_convolution_and_linear_op",
)
PLANS_MODULE = "test_tensorrt_plans_every_architecture"


def pytest_addoption(parser):
    parser.addoption(
        "--every-architecture",
        action="store_true",
        help="also build TensorRT-RTX plans in three precisions for every architecture, not only the smallest of each family",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "every_architecture: runs only with --every-architecture")


def _fast_architectures() -> set[str]:
    """The smallest architecture of every family: the ones the photo checks name."""
    import test_parity_every_architecture as parity

    return {check.arch for check in parity.PHOTO_CHECKS.values()}


def pytest_collection_modifyitems(config, items):
    fast = _fast_architectures()
    every_architecture = config.getoption("--every-architecture")
    kept, deselected = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        arch, family = params.get("arch"), params.get("family")
        slow = item.originalname in SLOW_TESTS or any(name in item.fixturenames for name in COMPILED_FIXTURES)
        if arch is not None:
            plans = item.module.__name__ == PLANS_MODULE
            slow = slow or arch not in (FAST_PLANS if plans else fast)
            if plans and arch not in fast and arch not in FAST_PLANS:
                item.add_marker(pytest.mark.every_architecture)
                if not every_architecture:
                    deselected.append(item)
                    continue
        if family is not None and item.originalname == "test_smallest_model_keeps_timms_top1_on_every_photo_in_fp16_and_bf16":
            slow = slow or family not in FAST_PHOTO_CHECKS
        if slow:
            item.add_marker(pytest.mark.slow)
        kept.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
