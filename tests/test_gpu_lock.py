"""The GPU timing lock: builds running side by side time their candidates one at a time."""

import multiprocessing
import time

from trtmc.backends.gpu_lock import lock_path, timing_alone


def _hold(path, seconds, ready):
    with timing_alone(path):
        ready.set()
        time.sleep(seconds)


def _holder(path, seconds):
    """Another process holding the lock for `seconds`, started and holding it already."""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold, args=(path, seconds, ready))
    holder.start()
    assert ready.wait(60), "the holding process never took the lock"
    return holder


def test_lock_path_is_one_file_per_gpu_with_a_safe_name(tmp_path):
    a = lock_path("GPU-1234/abcd ef", tmp_path)
    assert a.parent == tmp_path and "/" not in a.name[len("trtmc-gpu-timing-"):] and " " not in a.name
    assert a == lock_path("GPU-1234/abcd ef", tmp_path)
    assert a != lock_path("GPU-5678", tmp_path)


def test_a_second_process_waits_until_the_first_lets_go(tmp_path):
    path = lock_path("GPU-test", tmp_path)
    holder = _holder(path, 1.0)
    try:
        waits = []
        with timing_alone(path, waits.append) as wait:
            pass
        assert wait >= 0.5, f"took the lock after {wait:.2f} s while another process held it for 1 s"
        assert waits == [wait]
    finally:
        holder.join(60)


def test_the_lock_is_free_again_after_its_holder_dies(tmp_path):
    path = lock_path("GPU-test", tmp_path)
    holder = _holder(path, 600.0)
    holder.kill()
    holder.join(60)
    started = time.perf_counter()
    with timing_alone(path) as wait:
        pass
    assert wait < 5 and time.perf_counter() - started < 5


def test_an_uncontended_lock_reports_no_wait(tmp_path):
    waits = []
    with timing_alone(lock_path("GPU-test", tmp_path), waits.append) as wait:
        pass
    assert wait < 0.1 and waits == []


def test_a_lock_that_cannot_be_opened_lets_the_timing_go_on_without_it(tmp_path, caplog):
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    with timing_alone(not_a_folder / "trtmc-gpu-timing-x.lock") as wait:
        ran = True
    assert ran and wait == 0.0 and "timing the candidates without it" in caplog.text
