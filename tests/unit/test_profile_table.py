"""`benchlab.core.profile_table`: the profile stage's tables are read back as they are written (the kernel families
with their figures, a CPU profile's top ops), one format for the writer (benchlab/run/profiling.py) and the reader
(the run report)."""

from types import SimpleNamespace

from benchlab.core.profile_table import Profile, family, read_profile
from benchlab.run.profiling import cpu_ops_markdown, kernel_markdown, kernel_summary


def test_a_gpu_profile_s_families_are_read_back_as_written() -> None:
    events = [{"cat": "kernel", "name": "nvjet_sm90_tst_256x128", "ts": 0, "dur": 3000},
              {"cat": "kernel", "name": "flash_fwd_kernel", "ts": 3000, "dur": 1000},
              {"cat": "kernel", "name": "some_unknown_kernel", "ts": 4000, "dur": 500}]
    text = "# recipe: top kernels by device time\n\ngpt2_124m, 2 traced steps.\n\n" + kernel_markdown(
        kernel_summary(events, steps=2))
    assert read_profile(text) == Profile("gpt2_124m, 2 traced steps",
                                         {"matmul": (1.5, 66.7), "attention": (0.5, 22.2), "other": (0.25, 11.1)}, [])
    assert family("flash_fwd_kernel") == "attention" and family("some_unknown_kernel") == "other"


def test_a_cpu_profile_s_top_three_ops_are_read_back_as_written() -> None:
    ops = [SimpleNamespace(key=f"aten::op{i}", count=2, self_cpu_time_total=1000.0 * (5 - i)) for i in range(5)]
    text = "# fp32: top ops by self CPU time\n\ntiny, 1 traced step.\n\n" + cpu_ops_markdown(
        SimpleNamespace(key_averages=lambda: ops), steps=1)
    assert read_profile(text) == ("tiny, 1 traced step", {},
                                  ["`aten::op0` 33.3%", "`aten::op1` 26.7%", "`aten::op2` 20.0%"])


def test_a_committed_style_profile_reads_families_or_a_cpu_profiles_top_ops() -> None:
    gpu = ("# recipe: top kernels by device time\n\ngpt2_124m, batch 16 x 1024, 2 traced steps after 6 warm-up "
           "steps.\n\n| family | device ms per step | share % |\n| --- | --- | --- |\n| matmul | 16.30 | 53.2 |\n"
           "| attention | 3.71 | 12.1 |\n\n| kernel | family | calls per step | device ms per step | share % |\n"
           "| --- | --- | --- | --- | --- |\n| `nvjet_sm90_tst_256x128` | matmul | 49.0 | 5.276 | 17.5 |\n")
    header, families, ops = read_profile(gpu)
    assert header == "gpt2_124m, batch 16 x 1024, 2 traced steps after 6 warm-up steps"
    assert families == {"matmul": (16.30, 53.2), "attention": (3.71, 12.1)} and ops == []
    cpu = ("# recipe: top ops by self CPU time\n\ntiny, batch 16 x 128, 3 traced steps.\n\n"
           "| op | calls per step | self CPU ms per step | share % |\n| --- | --- | --- | --- |\n"
           "| `aten::mm` | 27.0 | 8.508 | 17.5 |\n")
    assert read_profile(cpu) == ("tiny, batch 16 x 128, 3 traced steps", {}, ["`aten::mm` 17.5%"])
