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
