"""The GPU timing lock: builds running side by side time their candidates one at a time, and no process's Inductor
benchmarks its kernels meanwhile."""

import multiprocessing
import time

from trtmc.backends.gpu_lock import HOOKED_METHODS, benchmarking_beside, lock_path, share_gpu_with_timing, timing_alone
from trtmc.files import exclusive_lock


def _hold(path, seconds, ready):
    with timing_alone(path):
        ready.set()
        time.sleep(seconds)


def _started(target, *args):
    """Another process running `target(*args, ready)`, once it has said it holds what it takes (`ready`)."""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    process = ctx.Process(target=target, args=(*args, ready))
    process.start()
    assert ready.wait(60), f"the process running {target.__name__} never got going"
    return process


def _holder(path, seconds):
    """Another process holding the lock for `seconds`, started and holding it already."""
    return _started(_hold, path, seconds)


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


# ---- the shared side: Inductor's benchmarks in other processes ----


def _benchmark(path, seconds, ready):
    with benchmarking_beside(path):
        ready.set()
        time.sleep(seconds)


def _hold_turnstile(path, seconds, ready):
    """What a build waiting to time holds: the turnstile, not yet the lock."""
    with exclusive_lock(path.with_name(path.name + ".turnstile")):
        ready.set()
        time.sleep(seconds)


def _wait_to_benchmark_beside(path, target, seconds) -> float:
    """The seconds this process waits to benchmark while another process runs `target` for `seconds`."""
    other = _started(target, path, seconds)
    try:
        started = time.perf_counter()
        with benchmarking_beside(path):
            return time.perf_counter() - started
    finally:
        other.join(60)


def test_a_build_waits_to_time_until_benchmarks_in_other_processes_end(tmp_path):
    path = lock_path("GPU-test", tmp_path)
    benchmarking = _started(_benchmark, path, 1.0)
    try:
        with timing_alone(path) as wait:
            pass
        assert wait >= 0.5, f"timed after {wait:.2f} s beside a benchmark of 1 s"
    finally:
        benchmarking.join(60)


def test_a_benchmark_waits_while_a_build_times(tmp_path):
    path = lock_path("GPU-test", tmp_path)
    assert _wait_to_benchmark_beside(path, _hold, 1.0) >= 0.5


def test_benchmarks_of_several_processes_run_together(tmp_path):
    path = lock_path("GPU-test", tmp_path)
    assert _wait_to_benchmark_beside(path, _benchmark, 2.0) < 0.5


def test_a_build_waiting_to_time_holds_back_new_benchmarks(tmp_path):
    # Without the turnstile, a stream of overlapping benchmarks from 14 processes could keep a build from ever timing.
    path = lock_path("GPU-test", tmp_path)
    assert _wait_to_benchmark_beside(path, _hold_turnstile, 1.0) >= 0.5


def test_a_benchmark_inside_a_benchmark_does_not_queue_behind_a_waiting_build(tmp_path):
    # The inner one passing the turnstile again would wait for a build that waits for the outer one: a deadlock.
    path = lock_path("GPU-test", tmp_path)
    with benchmarking_beside(path):
        assert _wait_to_benchmark_beside(path, _hold_turnstile, 2.0) < 0.5


def test_inductors_benchmarks_take_their_share_once_hooked(tmp_path):
    from torch._inductor.runtime.benchmarking import benchmarker

    path = lock_path("GPU-test", tmp_path)
    assert share_gpu_with_timing(path) and share_gpu_with_timing(lock_path("GPU-other", tmp_path))
    try:
        assert benchmarker.benchmark_gpu._trtmc_timing_lock == path  # hooked once, to the first GPU's lock
        timing = _holder(path, 1.0)
        try:
            started = time.perf_counter()
            try:
                benchmarker.benchmark_gpu(lambda: None)
            except Exception:  # no GPU here: the benchmark itself fails, after the wait this test is about
                pass
            assert time.perf_counter() - started >= 0.5, "Inductor benchmarked while a build was timing"
        finally:
            timing.join(60)
    finally:
        for name in HOOKED_METHODS:
            if name in vars(benchmarker):
                delattr(benchmarker, name)  # the class's own method again, for the other tests
