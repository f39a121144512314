from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from trtmc.random_weights import CALIBRATION_IMAGES, BatchNormStatistics, RandomWeights, save_random_checkpoint


# Random checkpoints of full-size models run to hundreds of MB each (vit_base_patch16_224: 331 MB), and the
# suite asks for some 300 of them: kept all session they filled 11 GB of a CI disk that had less to give.
# So the cache keeps what fits in CHECKPOINT_CACHE_BYTES and gives up the least recently used: after a test,
# only checkpoints that test bodies asked for (a fixture may hold its path for the module's later tests);
# between modules, any. A checkpoint asked for again after that is written again, so the tests that take an
# `arch` run architecture by architecture (pytest_collection_modifyitems), each written once per module.
CHECKPOINT_CACHE_BYTES = 2 * 2**30


@dataclass
class CachedCheckpoint:
    folder: Path
    size: int  # bytes on disk
    held: bool = False  # asked for by a fixture of the current module, which may keep its path


class CheckpointCache:
    def __init__(self, tmp_path_factory, budget_bytes: int):
        self._factory, self._budget = tmp_path_factory, budget_bytes
        self._entries: dict[tuple, CachedCheckpoint] = {}  # oldest use first
        self.in_test_body = False  # set around each test's call (pytest_runtest_call below)

    def get(self, key: tuple, arch: str, weights, timm_kwargs: dict) -> Path:
        if key in self._entries:
            self._entries[key] = self._entries.pop(key)  # now the most recently used
        else:
            folder = save_random_checkpoint(arch, self._factory.mktemp(arch.replace("/", "_")), weights, **timm_kwargs)
            self._entries[key] = CachedCheckpoint(folder, sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()))
        entry = self._entries[key]
        entry.held |= not self.in_test_body
        return entry.folder

    def trim(self, *, module_done: bool) -> None:
        """Remove the least recently used checkpoints that may go until the rest fit the budget."""
        import shutil

        total = sum(entry.size for entry in self._entries.values())
        for key, entry in list(self._entries.items()):
            if total <= self._budget:
                break
            if module_done or not entry.held:
                del self._entries[key]
                shutil.rmtree(entry.folder, ignore_errors=True)
                total -= entry.size
        if module_done:
            for entry in self._entries.values():
                entry.held = False  # the next module's fixtures hold what they ask for again


_CACHES: list[CheckpointCache] = []


@pytest.fixture(scope="session")
def checkpoint_cache(tmp_path_factory):
    _CACHES.append(CheckpointCache(tmp_path_factory, CHECKPOINT_CACHE_BYTES))
    return _CACHES[-1]


@pytest.fixture(scope="module", autouse=True)
def _trim_checkpoints_after_each_module(checkpoint_cache):
    yield
    checkpoint_cache.trim(module_done=True)


@pytest.fixture(autouse=True)
def _trim_checkpoints_after_each_test(checkpoint_cache):
    yield
    checkpoint_cache.trim(module_done=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    for cache in _CACHES:
        cache.in_test_body = True
    try:
        return (yield)
    finally:
        for cache in _CACHES:
            cache.in_test_body = False


@pytest.fixture(scope="session")
def timm_checkpoint(checkpoint_cache):
    """`timm_checkpoint("ghostnet_100")` -> folder with random weights (batch-norm statistics calibrated on
    noise) in the HF layout, cached (see CheckpointCache). Keywords: `seed`, `statistics` (a
    BatchNormStatistics), `calibration_images` (how many noise images), and anything else for
    `timm.create_model`."""

    def make(
        arch: str, *, seed: int = 0, statistics=BatchNormStatistics.CALIBRATED, calibration_images=CALIBRATION_IMAGES,
        **timm_kwargs,
    ):
        weights = RandomWeights(seed, statistics, calibration_images)
        return checkpoint_cache.get((arch, weights, repr(sorted(timm_kwargs.items()))), arch, weights, timm_kwargs)

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
    # Within a module, the tests that take an `arch` run architecture by architecture (the checkpoint cache's
    # note above); everything else keeps its place.
    first_seen: dict[tuple, int] = {}
    for index, item in enumerate(kept):
        first_seen.setdefault(_arch_group(item), index)
    items[:] = sorted(kept, key=lambda item: first_seen[_arch_group(item)])


def _arch_group(item) -> tuple:
    arch = getattr(getattr(item, "callspec", None), "params", {}).get("arch")
    return (item.module.__name__, arch) if arch is not None else (item.nodeid,)
