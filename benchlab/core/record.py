"""A variant's result read as a type: the facts every reader of results shares, decided here once.

The bench and train stages write a result as flat JSON with units in its keys (benchlab/run/records.py); the
summary's rows, the plots, the run report, the search and the README's tables read those keys. Which memory
figure a row is compared by, the mean of a loss curve's tail, which row the ratios are taken against, and which
keys are metrics are asked by several of them; each is answered by this module, so they cannot drift apart.
Torch-free, so the analysis side, the run side and the search all import it.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ALLOCATED = "peak_mem_allocated_mb"  # CUDA's peak of allocated tensor bytes
RESERVED = "peak_mem_reserved_mb"  # CUDA's peak reserved by the caching allocator (the graph pools included)
RSS = "peak_rss_mb"  # the process's peak resident set: a CPU run's only figure
MEMORY_KEYS = (ALLOCATED, RESERVED, RSS)
# False where CUDA graphs allocate from private pools that the allocated peak does not see: compare RESERVED then.
ALLOCATED_COMPARABLE = "peak_mem_allocated_comparable"

# The figures a result file and the summary both carry, for `dvc metrics diff` and `dvc exp show`: numbers only,
# never the environment or provenance strings, which stay in the full record.
_MEASURED_KEYS = ("tokens_per_sec", "tokens_per_sec_per_gpu", "tokens_per_sec_wall", "step_ms_median", *MEMORY_KEYS,
                  "mfu_pct", "val_loss", "power_w_mean", "tokens_per_joule")
# A result file's metrics (the train stage's metrics file; a variant's record carries them too).
METRIC_KEYS = (*_MEASURED_KEYS, "world_size", "host_overhead_pct", "step_ms_p90", "warmup_s", "final_train_loss",
               "val_perplexity")
# The summary's metrics per variant: the measured figures and the ratios taken against the reference row.
SUMMARY_KEYS = (*_MEASURED_KEYS, "scaling_efficiency_pct", "val_loss_gap_1proc", "speedup_x", "mem_change_pct",
                "parity_gap_nats")

# The parity reference's record and curve in the parity folders (metrics/parity/reference-seeds.json,
# plots/parity/reference-seeds.csv): the reference trained with both batch orders. The parity stage writes it, every
# parity@ stage, the search and the report read it; a hyphen keeps it apart from every variant name.
REFERENCE_SEEDS = "reference-seeds"

# The learning-parity check's window (README "Does it still learn the same"): a run's mean training loss over its
# last 50 steps, of 300. Kept for every repeat, since bf16 runs of one configuration part run to run (the one-pass
# head's two parity runs ended 0.03 nats apart on the H200) and a verdict wants their spread.
TAIL_STEPS = 50


@dataclass(frozen=True)
class Memory:
    """A run's memory peaks in MiB, None where not measured: allocated and reserved on a GPU, RSS on a CPU."""

    allocated_mb: float | None = None
    reserved_mb: float | None = None
    rss_mb: float | None = None
    # False under CUDA graphs: they allocate from private pools that the allocated peak does not see.
    allocated_comparable: bool = True

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> "Memory":
        """The peaks of a flat result, a summary row or a run's memory dict (they share the keys)."""
        return cls(record.get(ALLOCATED), record.get(RESERVED), record.get(RSS),
                   record.get(ALLOCATED_COMPARABLE) is not False)

    def compared_key(self) -> str:
        """The key of the figure rows are compared by: the reserved peak where CUDA graphs hide their pools from the
        allocated one, else the allocated peak where it was measured (a GPU), else the resident set (a CPU)."""
        if not self.allocated_comparable:
            return RESERVED
        return ALLOCATED if self.allocated_mb is not None else RSS

    def compared(self) -> float | None:
        """The figure rows are compared by (`compared_key`), MiB."""
        return {ALLOCATED: self.allocated_mb, RESERVED: self.reserved_mb, RSS: self.rss_mb}[self.compared_key()]

    @property
    def by_reserved(self) -> bool:
        """Compared by the reserved peak: drawn hatched and labelled "reserved"."""
        return self.compared_key() == RESERVED

    def reached(self) -> float | None:
        """Where a run that ran out of memory stopped: the reserved peak, else the allocated one; None unread."""
        return self.reserved_mb or self.allocated_mb


@dataclass(frozen=True)
class Result:
    """One variant's result as the bench stage wrote it, the part every reader needs typed."""

    variant: str
    status: str  # ok | skipped | oom | diverged | error
    message: str = ""
    tokens_per_sec: float | None = None
    memory: Memory = field(default_factory=Memory)

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> "Result":
        """A flat result record (or a summary row, which keeps its keys) as a Result."""
        return cls(record["variant"], record["status"], record.get("message") or "", record.get("tokens_per_sec"),
                   Memory.of(record))

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def compared_memory(self) -> float | None:
        """The memory figure this row is compared by (Memory.compared), MiB."""
        return self.memory.compared()


def compared_memory(record: Mapping[str, Any]) -> float | None:
    """A flat record's compared memory figure (Memory.compared), MiB."""
    return Memory.of(record).compared()


def ratio_reference(results: Iterable[Result], baseline: str, fallbacks: Sequence[str] = ()) -> str | None:
    """The variant every ratio is taken against: the baseline where it ran ok; else the first of `fallbacks` that
    did (a 24 GiB card cannot hold fp32 GPT-2 124M at batch 16 x 1024, but it can hold the recipe); else None."""
    ran = {r.variant for r in results if r.ok}
    return next((name for name in (baseline, *fallbacks) if name in ran), None)


def tail_loss(losses: Sequence[float], steps: int = TAIL_STEPS) -> float:
    """The mean training loss over a run's last `steps` steps (all of them when it ran fewer)."""
    tail = losses[-steps:]
    return sum(tail) / len(tail)


def numbers(record: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The figures among `keys` that a record holds as numbers (a bool is an int to Python, but no metric)."""
    return {k: record[k] for k in keys if isinstance(record.get(k), (int, float)) and not isinstance(record[k], bool)}
