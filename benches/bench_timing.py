"""The timing loop the side-by-side benchmarks share (imported from the
scripts in this folder: `python benches/X.py` puts it on sys.path)."""
import statistics
import time


def time_calls(fn, min_time, warmups=3, min_calls=7, max_calls=100000):
    """Calls `fn` `warmups` times untimed, then at least `min_calls` times
    and until `min_time` seconds have passed (at most `max_calls`).
    Returns (median seconds, fastest seconds, CPU seconds per call of the
    whole process, calls timed)."""
    for _ in range(warmups):
        fn()
    samples = []
    cpu0 = time.process_time()
    start = time.perf_counter()
    while len(samples) < max(min_calls, 1) or (time.perf_counter() - start < min_time and len(samples) < max_calls):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    cpu = (time.process_time() - cpu0) / len(samples)
    return statistics.median(samples), min(samples), cpu, len(samples)
