"""Ray Data beyond one machine: a local Ray cluster (2 actors on the CPU) classifies the repo's photos with a CPU
bundle and gets, file for file, the logits `image_to_class_scores` gives."""

from __future__ import annotations

import numpy as np
import pytest
import ray

from support import IMAGES, watch_load_options
from trtmc.runtime import Runtime
from trtmc.tasks import image_to_class_scores

PHOTOS = sorted(p for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png"))


@pytest.fixture(scope="module")
def local_ray():
    # Logical CPUs, not cores: the read task and both actors (one CPU each) must be able to run at once,
    # or Ray Data waits for a CPU that never frees (it did, for 30 minutes, on the 2-core CI machine).
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_read_images_then_map_batches_gives_the_tasks_logits_for_every_file(local_ray, lite0_bundle):
    from trtmc.ray import ClassifyBatch

    ray.data.DataContext.get_current().execution_no_progress_timeout_s = 300  # fail in minutes, not half an hour
    ds = ray.data.read_images([str(p) for p in PHOTOS], mode="RGB", include_paths=True)
    ds = ds.map_batches(
        ClassifyBatch,
        fn_constructor_kwargs={"bundle": str(lite0_bundle), "top_k": 3},
        compute=ray.data.ActorPoolStrategy(size=2),
        batch_size=4,
        num_cpus=1,
    )
    rows = {row["path"]: row for row in ds.drop_columns(["image"]).take_all()}
    assert len(rows) == len(PHOTOS)
    expected = image_to_class_scores(Runtime.open(lite0_bundle), [str(p) for p in PHOTOS])
    for photo, logits, top in zip(PHOTOS, expected.logits, expected.top(3)):
        row = next(r for path, r in rows.items() if path.endswith(photo.name))
        # Equal up to fp32 rounding (measured 3.1e-6 on logits ~10): each actor is another process, with Ray's
        # thread settings and its batches of 4.
        assert np.abs(np.asarray(row["logits"]) - logits).max() <= 1e-5 * np.abs(logits).max(), photo.name
        assert list(row["top_indices"]) == [t.index for t in top]
        assert row["top_labels"][0] == top[0].label


def test_a_path_column_is_classified_like_the_files(lite0_bundle):
    from trtmc.ray import ClassifyBatch

    classify = ClassifyBatch(lite0_bundle, top_k=1)
    paths = [str(PHOTOS[0]), str(PHOTOS[1])]
    out = classify({"path": np.array(paths, dtype=object)})
    expected = image_to_class_scores(classify.runtime, paths).logits
    assert out["logits"].shape == (2, 1000) and np.abs(out["logits"] - expected).max() <= 1e-6
    assert out["top_indices"].shape == (2, 1)


def test_a_batch_without_an_image_or_path_column_is_refused(lite0_bundle):
    from trtmc.ray import ClassifyBatch
    from trtmc.tasks import InvalidInput

    with pytest.raises(InvalidInput, match="needs an 'image' or a 'path' column, it has pixels"):
        ClassifyBatch(lite0_bundle)({"pixels": np.zeros((1, 4, 4, 3), np.uint8)})


def test_actors_load_their_engine_for_a_quick_start_unless_told_not_to(lite0_bundle, monkeypatch):
    # Each actor loads its own engine: a CUDA inductor engine compiling in every one costs each its start-up.
    from trtmc.backends import LoadOptions
    from trtmc.ray import ClassifyBatch

    asked = watch_load_options(monkeypatch, "inductor")
    ClassifyBatch(lite0_bundle)
    ClassifyBatch(lite0_bundle, quick_start=False)
    assert asked == [LoadOptions(quick_start=True), LoadOptions(quick_start=False)]
