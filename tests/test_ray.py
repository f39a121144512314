"""Ray Data beyond one machine: on a local Ray cluster, CPU tasks crop the repo's photos (`CropImages`) and 2
actors on the CPU classify the crops (`ClassifyBatch`) with a CPU bundle, giving, file for file, the logits
`image_to_class_scores` gives; each stage on its own, and what each refuses."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import ray
from PIL import Image

from support import IMAGES, watch_load_options
from trtmc.runtime import Runtime
from trtmc.tasks import InvalidInput, image_to_class_scores, load_image

PHOTOS = sorted(p for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png"))
PIXEL_COLUMNS = {"image", "crop"}


def read_images_batch(photos) -> dict:
    """What `ray.data.read_images(..., mode="RGB", include_paths=True)` hands `map_batches`: HWC uint8 arrays
    of every size in an object column, and the paths."""
    images = np.empty(len(photos), dtype=object)
    images[:] = [np.asarray(Image.open(p).convert("RGB")) for p in photos]
    return {"image": images, "path": np.array([str(p) for p in photos], dtype=object)}


@pytest.fixture(scope="module")
def local_ray():
    # Logical CPUs, not cores: the read tasks (which crop too) and both actors (two CPUs each) must be able to
    # run at once, or Ray Data waits for a CPU that never frees (it did, for 30 minutes, on the 2-core CI
    # machine).
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_read_images_then_crop_tasks_then_actors_give_the_tasks_logits_for_every_file(local_ray, lite0_bundle):
    from trtmc.ray import ClassifyBatch, CropImages

    ray.data.DataContext.get_current().execution_no_progress_timeout_s = 300  # fail in minutes, not half an hour
    ds = ray.data.read_images([str(p) for p in PHOTOS], mode="RGB", include_paths=True)
    ds = ds.map_batches(CropImages(lite0_bundle))  # no batch size: each read task crops what it decoded
    ds = ds.map_batches(
        ClassifyBatch,
        fn_constructor_kwargs={"bundle": str(lite0_bundle), "top_k": 3},
        compute=ray.data.ActorPoolStrategy(size=2),
        batch_size=4,
        num_cpus=2,  # not the tasks' resources (as num_gpus would be), or Ray fuses the crop into the actors
    )
    rows = {row["path"]: row for row in ds.take_all()}
    assert len(rows) == len(PHOTOS)
    # Ray fused the crop into the read tasks: the full-size photos never left the process that decoded them.
    assert "ReadImage->MapBatches(CropImages)" in ds.stats()
    assert {name for row in rows.values() for name in row} == {"path", "logits", "top_indices", "top_scores", "top_labels"}
    expected = image_to_class_scores(Runtime.open(lite0_bundle), [str(p) for p in PHOTOS])
    for photo, logits, top in zip(PHOTOS, expected.logits, expected.top(3)):
        row = next(r for path, r in rows.items() if path.endswith(photo.name))
        # Equal up to fp32 rounding (measured 3.1e-6 on logits ~10): each actor is another process, with Ray's
        # thread settings and its batches of 4.
        assert np.abs(np.asarray(row["logits"]) - logits).max() <= 1e-5 * np.abs(logits).max(), photo.name
        assert list(row["top_indices"]) == [t.index for t in top]
        assert list(row["top_labels"]) == [t.label for t in top]


def test_the_crop_stage_gives_exactly_the_tasks_crop_and_drops_the_full_size_images(lite0_reference_bundle):
    from trtmc.ray import CropImages

    crop = CropImages(lite0_reference_bundle)
    spec = crop.preprocess
    expected = np.stack([spec.crop_pil(load_image(p)) for p in PHOTOS])  # what the task normalizes
    batch = read_images_batch(PHOTOS)
    out = crop(batch)
    assert set(out) == {"path", "crop"} and list(out["path"]) == list(batch["path"])
    assert out["crop"].dtype == np.uint8 and out["crop"].shape == (len(PHOTOS), *spec.input_size, 3)
    assert np.array_equal(out["crop"], expected)
    assert np.array_equal(crop({"path": batch["path"]})["crop"], expected)  # a path column crops alike


def test_the_crop_stage_is_the_bundles_preprocessing_contract_alone_small_to_ship_to_tasks(lite0_reference_bundle):
    from trtmc.ray import CropImages

    crop = CropImages(lite0_reference_bundle)
    assert vars(crop) == {"preprocess": Runtime.open(lite0_reference_bundle).preprocess}  # no engine, no weights
    assert len(pickle.dumps(crop)) < 1000
    assert CropImages(crop.preprocess).preprocess == crop.preprocess


def test_crops_are_classified_like_the_files_and_no_pixel_column_comes_back(lite0_reference_bundle):
    from trtmc.ray import ClassifyBatch, CropImages

    classify = ClassifyBatch(lite0_reference_bundle, top_k=2)
    photos = PHOTOS[:2]
    batch = {**CropImages(lite0_reference_bundle)(read_images_batch(photos)), "id": np.array([7, 8])}
    out = classify(batch)
    assert set(out) == {"path", "id", "logits", "top_indices", "top_scores", "top_labels"}
    assert list(out["id"]) == [7, 8]
    expected = image_to_class_scores(classify.runtime, [str(p) for p in photos])
    assert np.abs(out["logits"] - expected.logits).max() <= 1e-6
    assert [list(labels) for labels in out["top_labels"]] == [[t.label for t in row] for row in expected.top(2)]
    # An image column is cropped in the actor, as before, and is not returned either.
    assert not PIXEL_COLUMNS & set(classify(read_images_batch(photos)))


def test_a_path_column_is_classified_like_the_files(lite0_reference_bundle):
    from trtmc.ray import ClassifyBatch

    classify = ClassifyBatch(lite0_reference_bundle, top_k=1)
    paths = [str(PHOTOS[0]), str(PHOTOS[1])]
    out = classify({"path": np.array(paths, dtype=object)})
    expected = image_to_class_scores(classify.runtime, paths).logits
    assert out["logits"].shape == (2, 1000) and np.abs(out["logits"] - expected).max() <= 1e-6
    assert out["top_indices"].shape == (2, 1)


def test_a_batch_without_pixels_is_refused_saying_which_columns_would_do(lite0_reference_bundle):
    from trtmc.ray import ClassifyBatch, CropImages

    pixels = {"pixels": np.zeros((1, 4, 4, 3), np.uint8)}
    with pytest.raises(InvalidInput, match=r"needs a 'crop', an 'image' or a 'path' column, it has pixels; .*CropImages"):
        ClassifyBatch(lite0_reference_bundle)(pixels)
    with pytest.raises(InvalidInput, match=r"needs an 'image' or a 'path' column, it has pixels; .*read_images"):
        CropImages(lite0_reference_bundle)(pixels)


@pytest.mark.parametrize(
    "crops, said",
    [
        (np.zeros((2, 3, 224, 224), np.uint8), r"holds uint8 \(2, 3, 224, 224\)"),  # NCHW
        (np.zeros((2, 256, 256, 3), np.uint8), r"holds uint8 \(2, 256, 256, 3\)"),  # another bundle's size
        (np.zeros((2, 224, 224, 3), np.float32), r"holds float32 \(2, 224, 224, 3\)"),  # normalized already
        (np.array([np.zeros((224, 224, 3), np.uint8), np.zeros((200, 224, 3), np.uint8), None], dtype=object)[:2],
         r"holds crops of 2 shapes"),
    ],
    ids=["nchw", "other-size", "float", "ragged"],
)
def test_a_wrongly_shaped_crop_is_refused_naming_the_shape_wanted_and_the_fix(lite0_reference_bundle, crops, said):
    from trtmc.ray import ClassifyBatch

    fix = r".*uint8 NHWC crops of \(N, 224, 224, 3\), as trtmc.ray.CropImages\(bundle\) makes them"
    with pytest.raises(InvalidInput, match=said + fix):
        ClassifyBatch(lite0_reference_bundle)({"crop": crops})


def test_actors_load_their_engine_for_a_quick_start_unless_told_not_to(lite0_bundle, monkeypatch):
    # Each actor loads its own engine: a CUDA inductor engine compiling in every one costs each its start-up.
    from trtmc.backends import LoadOptions
    from trtmc.ray import ClassifyBatch

    asked = watch_load_options(monkeypatch, "inductor")
    ClassifyBatch(lite0_bundle)
    ClassifyBatch(lite0_bundle, quick_start=False)
    assert asked == [LoadOptions(quick_start=True), LoadOptions(quick_start=False)]
