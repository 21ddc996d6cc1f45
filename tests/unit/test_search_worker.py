"""The screening worker's figures (benchlab/search/runs.py): a run's wall time broken down and its memory compared
as the report compares it. The worker's own process is tested in tests/integration/test_search_worker.py."""

from benchlab.run.runner import Measurement
from benchlab.search import runs


def test_the_breakdown_names_every_part_of_a_run_s_wall_time() -> None:
    rec = Measurement(status="ok", startup_s=4.0, init_s=1.0, apply_s=0.5, warmup_s=3.0, window_wall_ms=500.0,
                    eval_s=0.25, compile_hits=4, compile_misses=2)
    assert runs.breakdown(rec, 10.0) == {"startup_s": 4.0, "build_s": 1.0, "apply_s": 0.5, "warmup_s": 3.0,
                                         "timed_s": 0.5, "eval_s": 0.25, "other_s": 0.75, "compile_hits": 4,
                                         "compile_misses": 2}
    assert runs.breakdown(Measurement(status="oom"), 2.0)["timed_s"] is None


def test_memory_is_compared_as_the_report_compares_it() -> None:
    graphs = {"peak_mem_allocated_comparable": False, "peak_mem_allocated_mb": 2_900.0, "peak_mem_reserved_mb": 11_000.0}
    assert runs.compared_memory(graphs) == 11_000.0  # CUDA graphs' pools escape the allocated peak
    assert runs.compared_memory({"peak_mem_allocated_comparable": True, "peak_mem_allocated_mb": 9.0}) == 9.0
    assert runs.compared_memory({"peak_mem_allocated_mb": None, "peak_rss_mb": 450.0}) == 450.0
