"""trtmc's compiled Triton kernels carried in a bundle (`trtmc.backends.triton_cache`).

Triton compiles for a GPU target without one (`compiled_for`), so the archive and its restore are exercised on the
CPU with Triton's real compiler and cache: a kernel compiled into one cache, archived, put into an empty one, and
found there by Triton's next compile of the same kernel.
"""

import io
import os
import zipfile
from pathlib import Path

import pytest
import triton

from trtmc.backends import triton_cache
from trtmc.backends.depthwise_kernel import WINDOW_TILE, compiled_for
from trtmc.backends.inductor import point_triton_at_inductors_cache


@pytest.fixture
def compiles(monkeypatch):
    """Each of Triton's compiles from now on: (kernel name, whether its cache answered)."""
    seen = []

    def listener(src, metadata, metadata_group, times, cache_hit):
        seen.append((metadata["name"], cache_hit))

    monkeypatch.setattr(triton.knobs.compilation, "listener", listener)
    return seen


def test_a_restored_kernel_is_found_by_tritons_next_compile_in_a_cache_that_never_saw_it(tmp_path, monkeypatch,
                                                                                         compiles):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "build"))
    built = compiled_for(90, 3, WINDOW_TILE)
    data = triton_cache.archive([built])
    assert compiles == [("depthwise_window_kernel", False)]

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "load"))
    restored, again = triton_cache.restore(data), triton_cache.restore(data)
    assert restored == triton_cache.Restored(put=1, archived=1)
    assert again == triton_cache.Restored(put=0, archived=1)  # already there: nothing written again
    assert str(restored) == "put the bundle's 1 compiled Triton kernel into Triton's cache"
    assert str(again) == "Triton's cache held the bundle's 1 compiled Triton kernel already"
    loaded = compiled_for(90, 3, WINDOW_TILE)
    assert compiles[1:] == [("depthwise_window_kernel", True)]
    assert loaded.hash == built.hash and loaded.kernel == built.kernel


def test_a_load_puts_the_kernels_in_the_cache_inductor_points_launches_at(tmp_path, monkeypatch, compiles):
    # A user's process sets no TRITON_CACHE_DIR: Triton's default (~/.triton/cache) holds until Inductor loads its
    # first kernel and sets the variable to its own folder, where every later launch looks (run 34 set the variable
    # for both, so a restore into the default went unnoticed there).
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "build"))
    data = triton_cache.archive([compiled_for(90, 3, WINDOW_TILE)])
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    point_triton_at_inductors_cache(0)
    assert Path(os.environ["TRITON_CACHE_DIR"]) == tmp_path / "inductor" / "triton" / "0"  # Inductor's own choice
    assert triton_cache.restore(data).put == 1
    compiled_for(90, 3, WINDOW_TILE)
    assert compiles[1:] == [("depthwise_window_kernel", True)]
    assert not (tmp_path / "home").exists()


def test_a_load_leaves_a_triton_cache_the_user_chose(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    point_triton_at_inductors_cache(0)
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")


def test_the_archive_holds_each_kernels_metadata_and_binary_only():
    kernel = compiled_for(90, 3, WINDOW_TILE)
    with zipfile.ZipFile(io.BytesIO(triton_cache.archive([kernel]))) as zf:
        names = sorted(zf.namelist())
    assert names == [f"{kernel.hash}/depthwise_window_kernel.cubin", f"{kernel.hash}/depthwise_window_kernel.json"]
    assert triton_cache.archive([kernel]) == triton_cache.archive([kernel])  # the same kernels, the same bytes


@pytest.mark.parametrize("entry", ["../escape.json", "0" * 64 + "/../escape.json", "0" * 64 + "/sub/k.json",
                                   "not-a-hash/k.json"])
def test_an_archive_entry_that_is_not_a_kernel_file_in_its_folder_is_refused(tmp_path, monkeypatch, entry):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr(entry, b"{}")
    with pytest.raises(ValueError, match="not HASH/FILE; rebuild the bundle"):
        triton_cache.restore(buffer.getvalue())
    assert not (tmp_path / "escape.json").exists() and not (tmp_path / "cache").exists()
