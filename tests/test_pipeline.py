"""The streaming pipeline over image collections: input order, the task's own logits for every file, error
records that do not stop the run, bounded read-ahead, and how folders, lists and globs expand."""

from __future__ import annotations

import itertools
import multiprocessing
import shutil

import numpy as np
import pytest

from support import IMAGES
from trtmc.pipeline import NoImages, PipelineOptions, classify_files, expand_images
from trtmc.runtime import Runtime
from trtmc.tasks import image_to_class_scores

PHOTOS = sorted(p for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png"))


@pytest.fixture(scope="module")
def runtime(lite0_reference_bundle):
    return Runtime.open(lite0_reference_bundle)


def test_every_file_gets_the_logits_the_task_gives_it_alone_in_input_order(runtime, tmp_path):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    paths = [*PHOTOS[:5], broken, *PHOTOS[5:9], tmp_path / "missing.png"]
    results = list(classify_files(runtime, paths, PipelineOptions(batch_size=4, workers=2)))
    assert [r.image for r in results] == [str(p) for p in paths]
    for path, result in zip(paths, results):
        if path in (broken, tmp_path / "missing.png"):
            assert not result.ok and result.logits is None and path.name in result.error
            continue
        alone = image_to_class_scores(runtime, [str(path)]).logits[0]
        # Same pixels, same engine; a batch of 4 sums in another order than a batch of 1, which moves
        # float32 logits by an ulp or two (measured: 2.0e-6 on logits near 10, 2e-7 of the largest).
        assert result.ok and np.abs(result.logits - alone).max() <= 1e-6 * np.abs(alone).max(), path.name


@pytest.mark.parametrize("workers", [1, 2])  # decode threads, then forked processes writing into shared slots
def test_resizing_on_the_device_gives_every_file_the_bytes_and_logits_of_resizing_in_the_workers(runtime, tmp_path,
                                                                                              workers):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    paths = [*PHOTOS[:6], broken, *PHOTOS[6:]]
    by_workers = list(classify_files(runtime, paths, PipelineOptions(batch_size=4, workers=workers, resize_on="workers")))
    on_device = list(classify_files(runtime, paths, PipelineOptions(batch_size=4, workers=workers, resize_on="device")))
    assert [r.image for r in on_device] == [str(p) for p in paths]
    for a, b in zip(by_workers, on_device):
        assert a.error == b.error
        # The same crops (trtmc.resample reproduces Pillow byte for byte) and the same batches: the same bits.
        assert a.ok == b.ok and (not a.ok or np.array_equal(a.logits, b.logits)), a.image


def test_an_image_larger_than_a_slot_is_cropped_by_its_worker(runtime):
    big = PHOTOS[0]  # 512 x 512 and larger photos do not fit slots of 100 x 100 pixels
    options = PipelineOptions(batch_size=4, workers=2, resize_on="device", slot_pixels=100 * 100)
    [result] = list(classify_files(runtime, [big], options))
    alone = image_to_class_scores(runtime, [str(big)]).logits[0]
    assert result.ok and np.abs(result.logits - alone).max() <= 1e-6 * np.abs(alone).max()


def test_a_batch_holding_only_unreadable_files_still_reports_each(runtime, tmp_path):
    bad = [tmp_path / f"bad{i}.png" for i in range(5)]
    for path in bad:
        path.write_text("text")
    results = list(classify_files(runtime, [*bad, PHOTOS[0]], PipelineOptions(batch_size=4, workers=1)))
    assert [r.ok for r in results] == [False] * 5 + [True]


def test_the_pipeline_reads_ahead_a_bounded_number_of_files(runtime):
    drawn = 0

    def endless_photos():
        nonlocal drawn
        for path in itertools.cycle(PHOTOS):
            drawn += 1
            yield path

    options = PipelineOptions(batch_size=2, workers=2, prefetch_batches=2)
    window = 2 * (options.prefetch_batches + 1)
    for count, _ in enumerate(itertools.islice(classify_files(runtime, endless_photos(), options), 16), 1):
        # Files taken from the source but not yet yielded: at most the read-ahead window plus two batches
        # (one filling, one in flight), however many files have gone through.
        assert drawn - count <= window + 2 * options.batch_size, (count, drawn)


def test_one_photo_is_decoded_without_starting_a_pool_of_processes(runtime):
    # A fresh process classifying one photo has nothing for 16 forked decoders to do but start and stop.
    def children_while_streaming(paths, workers):
        results = classify_files(runtime, paths, PipelineOptions(workers=workers))
        next(results)
        children = multiprocessing.active_children()
        list(results)
        return children

    assert children_while_streaming([PHOTOS[0]], workers=4) == []
    assert len(children_while_streaming(PHOTOS[:8], workers=2)) == 2  # the check above can fail


def test_an_unknown_place_to_resize_is_refused_with_the_choices(runtime):
    with pytest.raises(ValueError, match="--resize-on must be one of auto, device, workers, got 'gpu'"):
        next(classify_files(runtime, PHOTOS, PipelineOptions(resize_on="gpu")))


def test_a_batch_size_beyond_the_engine_is_refused_with_the_fix(runtime):
    with pytest.raises(ValueError, match="--batch-size 5 is larger than this bundle's engine serves.*--max-batch 5"):
        next(classify_files(runtime, PHOTOS, PipelineOptions(batch_size=5)))


def test_folders_lists_and_globs_expand_in_the_order_given(tmp_path):
    folder = tmp_path / "photos"
    (folder / "nested").mkdir(parents=True)
    shutil.copy(PHOTOS[0], folder / "b.jpg")
    shutil.copy(PHOTOS[1], folder / "nested" / "a.JPG")
    (folder / "notes.txt").write_text("not an image")
    listing = tmp_path / "list.txt"
    listing.write_text(f"photos/b.jpg\n\n{PHOTOS[2]}\n")
    found = expand_images([str(PHOTOS[3]), str(folder), f"@{listing}", str(tmp_path / "photos" / "*.jpg")])
    assert found == [PHOTOS[3], folder / "b.jpg", folder / "nested" / "a.JPG", tmp_path / "photos/b.jpg", PHOTOS[2],
                     folder / "b.jpg"]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda tmp: tmp / "missing.jpg", "missing.jpg: no such file or folder"),
        (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "empty: the folder holds no images"),
        (lambda tmp: str(tmp / "*.png"), r"\*.png: the pattern matches no file"),
        (lambda tmp: f"@{tmp / 'nolist.txt'}", "nolist.txt: no such list file"),
    ],
)
def test_an_argument_that_names_no_image_is_refused_before_anything_runs(tmp_path, make, message):
    with pytest.raises(NoImages, match=message):
        expand_images([make(tmp_path)])


def test_fewer_files_than_the_largest_batch_run_at_the_smallest_size_that_holds_them():
    from types import SimpleNamespace

    from trtmc.backends import Batching
    from trtmc.pipeline import _batch_size

    cuda_like = SimpleNamespace(batching=Batching.fixed((1, 8, 64)))
    assert _batch_size(cuda_like, PipelineOptions(), 1) == 1  # one photo: the batch-1 graph only
    assert _batch_size(cuda_like, PipelineOptions(), 5) == 8
    assert _batch_size(cuda_like, PipelineOptions(), 500) == 64
    assert _batch_size(cuda_like, PipelineOptions(), None) == 64  # a stream of unknown length
    assert _batch_size(cuda_like, PipelineOptions(batch_size=64), 1) == 64  # asked for: kept
