"""The battery: each bad input stops its stage with its message, exit 2, and the earlier outputs as they were."""

import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from benchlab.core.attention_kernels import ATTENTION_KERNELS
from benchlab.core.sections import DataParams
from benchlab.core.stage_main import run_main
from benchlab.prep.corpus import prepare as prepare_corpus
from benchlab.run.checkpoint import FORMAT as CHECKPOINT_FORMAT
from stages import aggregate, bench, env, evaluate, prepare, train
from tests.conftest import micro_params

MB = 1_000_000  # a hostile value's length: a megabyte path, key or name


def set_params(**overrides: object) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / "params.yaml").write_text(yaml.safe_dump(micro_params(**({"data__corpus": "corpus.txt"} | overrides)), sort_keys=False))
    return apply


def add_variant(name: str, settings: dict) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        data = micro_params(data__corpus="corpus.txt")
        data["variants"][name] = settings
        (root / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return apply


def write_file(name: str, content: bytes) -> Callable[[Path], None]:
    return lambda root: (root / name).write_bytes(content)


class Evil:
    """A pickle that would create a file if it were ever unpickled with full pickle."""

    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def evil_checkpoint(root: Path) -> None:
    (root / "checkpoints").mkdir(exist_ok=True)
    with open(root / "checkpoints" / "model.pt", "wb") as f:
        pickle.dump({"format": CHECKPOINT_FORMAT, "payload": Evil()}, f)


def evil_torch_checkpoint(root: Path) -> None:
    """The same payload inside torch.save's own zip format."""
    (root / "checkpoints").mkdir(exist_ok=True)
    torch.save({"format": CHECKPOINT_FORMAT, "payload": Evil()}, root / "checkpoints" / "model.pt")


def prepare_tokens(corpus: Path, vocab: int, val: float, out: Path, text_limit: int) -> None:
    corpus.write_text(corpus.read_text()[:text_limit])
    prepare_corpus(DataParams(corpus=str(corpus), vocab_size=vocab, val_fraction=val), out)


def small_data(root: Path) -> None:
    """Token files from a 3 kB text: a validation split of about 100 tokens."""
    set_params(model="gpt_small", shape__block_size=256, shape__batch_size=1)(root)
    shutil.rmtree(root / "prep")
    prepare_tokens(root / "corpus.txt", 300, 0.1, root / "prep", text_limit=3000)


def checkpoint_of(model: str = "tiny", nan: bool = False, tokenizer: str = "") -> Callable[[Path], None]:
    """A checkpoint as the train stage writes it, of an untrained `model` (its weights NaN if `nan`), trained on the
    prepared data's tokenizer (or on the one whose sha256 is `tokenizer`)."""
    def write(root: Path) -> None:
        from benchlab.run.checkpoint import save_checkpoint
        from model.gpt import GPT, GPTConfig

        net = GPT(GPTConfig.from_name(model, vocab_size=512))
        if nan:
            with torch.no_grad():
                net.ln_f.weight.fill_(float("nan"))  # saved with its checksum: only the loss can tell
        tokenizer_sha256 = tokenizer or json.loads((root / "prep" / "meta.json").read_text())["tokenizer_sha256"]
        save_checkpoint(net, model, tokenizer_sha256, root / "checkpoints" / "model.pt")
    return write


def damaged_checkpoint(payload: bytes) -> Callable[[Path], None]:
    """A good checkpoint with `payload` written over the middle of its largest tensor; the zip stays intact."""
    def damage(root: Path) -> None:
        import zipfile

        checkpoint_of()(root)
        path = root / "checkpoints" / "model.pt"
        with zipfile.ZipFile(path) as z:
            info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        with path.open("r+b") as f:  # torch stores records uncompressed: the data follow the local header
            f.seek(info.header_offset + 26)
            name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
            f.seek(info.header_offset + 30 + name_len + extra_len + info.file_size // 2)
            f.write(payload)
    return damage


def then_params(breaker: Callable[[Path], None], **overrides: object) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        breaker(root)
        set_params(**overrides)(root)
    return apply


def twice(line: str, after: str = "") -> Callable[[Path], None]:
    """params.yaml with `line` given once more: at the end, or right after the line `after` (a section's head)."""
    def apply(root: Path) -> None:
        set_params()(root)
        text = (root / "params.yaml").read_text()
        text = text.replace(f"{after}\n", f"{after}\n{line}\n", 1) if after else text + line + "\n"
        (root / "params.yaml").write_text(text)
    return apply


def corrupt_parquet(root: Path) -> None:
    """A parquet file whose footer reads but whose (snappy) data page is damaged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [f"document {i} " + "word " * 200 for i in range(300)]}), root / "c.parquet")
    raw = bytearray((root / "c.parquet").read_bytes())
    raw[len(raw) // 3 : len(raw) // 3 + 400] = bytes(range(256)) + bytes(144)
    (root / "c.parquet").write_bytes(bytes(raw))
    set_params(data__corpus="c.parquet")(root)


def corrupt_gzip(root: Path) -> None:
    """A .jsonl.gz whose gzip header is right but whose deflate stream is damaged."""
    import gzip

    raw = bytearray(gzip.compress(b"".join(b'{"text": "line %d of a document"}\n' % i for i in range(2000))))
    raw[10:14] = b"\xff" * 4  # the first deflate block's header: zlib's "invalid block type"
    (root / "c.jsonl.gz").write_bytes(bytes(raw))
    set_params(data__corpus="c.jsonl.gz")(root)


def corpus_folder_with(make: Callable[[Path], None]) -> Callable[[Path], None]:
    """data.corpus a folder of one good text file and the special file `make` creates as extra.txt."""
    def apply(root: Path) -> None:
        (root / "texts").mkdir()
        (root / "texts" / "a.txt").write_text((root / "corpus.txt").read_text())
        make(root / "texts" / "extra.txt")
        set_params(data__corpus="texts")(root)
    return apply


def tokens_rewritten(split: str, data: bytes, count: object) -> Callable[[Path], None]:
    """Token files that meta.json agrees with (size and sha256) but that hold `data`."""
    def apply(root: Path) -> None:
        from benchlab.core.files import file_sha256

        (root / "prep" / f"{split}.bin").write_bytes(data)
        meta = json.loads((root / "prep" / "meta.json").read_text())
        meta[f"{split}_tokens"], meta[f"{split}_sha256"] = count, file_sha256(root / "prep" / f"{split}.bin")
        (root / "prep" / "meta.json").write_text(json.dumps(meta))
    return apply


def foreign_checkpoint(root: Path) -> None:
    (root / "checkpoints").mkdir(exist_ok=True)
    torch.save({"state_dict": {"w": torch.zeros(2)}}, root / "checkpoints" / "model.pt")


ENV = (env.main, ["metrics/env.json"], ["metrics/env.json"])
PREPARE = (prepare.main, ["prep"], ["prep"])
TRAIN = (train.main, ["prep", "checkpoints/model.pt", "metrics/train.json", "metrics/records/train.json", "plots/train.csv"],
         ["checkpoints/model.pt", "metrics/train.json", "metrics/records/train.json", "plots/train.csv"])
EVALUATE = (evaluate.main, ["prep", "checkpoints/model.pt", "metrics/eval.json"], ["metrics/eval.json"])
AGGREGATE = (aggregate.main, ["results", "steps", "parity", "profiles", "s.json", "s.md", "s.csv", "plots", "r.md"],
             ["s.json", "s.md", "s.csv", "plots", "r.md"])

# (case id, how to break the workspace, stage, words the message must hold)
CASES = [
    ("unknown top-level key", set_params(turbo=True), ENV, "unknown key 'turbo'"),
    ("unknown nested key", set_params(train__bogus=1), ENV, "unknown key 'train.bogus'"),
    ("unknown precision", set_params(precision="fp8"), ENV, "precision='fp8' is not valid; expected one of: fp32, tf32, fp16, bf16"),
    ("unknown checkpointing", set_params(activation_checkpointing="most"), ENV, "expected one of: none, full, selective"),
    ("unknown loss", set_params(loss="focal"), ENV, "loss='focal' is not valid; expected one of: standard, inline, chunked, fused, cce, onepass"),
    ("compile mode without compile", set_params(compile_mode="reduce-overhead"), ENV, "expected default unless compile=true"),
    ("accumulation that does not divide the batch", set_params(grad_accum=3), ENV, "grad_accum=3 is not valid"),
    ("fp8 given as a switch", set_params(fp8=True), ENV, "fp8=True is not valid; expected one of: none, blocks, head, all"),
    ("unknown optimizer", set_params(optimizer="adamw_4bit"), ENV,
     "optimizer='adamw_4bit' is not valid; expected one of: adamw, adamw_fused, adamw_compiled, adamw_8bit, adamw_bf16_sr"),
    ("unknown compile mode", set_params(compile=True, compile_mode="fastest"), ENV,
     "compile_mode='fastest' is not valid; expected one of: default, reduce-overhead, max-autotune-no-cudagraphs, max-autotune"),
    ("unknown gradient compression", add_variant("two", {"ddp_comm_hook": "fp8"}), ENV,
     "variants.two.ddp_comm_hook='fp8' is not valid; expected one of: none, bf16"),
    ("gradient compression without DDP", add_variant("two", {"ddp_comm_hook": "bf16"}), ENV,
     "variants.two.parallel='none' is not valid; expected ddp when ddp_bucket_mb, ddp_grad_as_bucket_view or "
     "ddp_comm_hook is set"),
    ("a process layout at the top level", set_params(parallel="ddp", nproc=2), ENV,
     "parallel='ddp' at the top level is not valid; set it in a variant (the train stage runs in one process"),
    ("unknown lock mode", set_params(harness__lock="steal"), ENV, "harness.lock='steal' is not valid; expected one of: wait, fail"),
    ("unknown attention", set_params(attention="flash"), ENV, f"expected one of: {', '.join(ATTENTION_KERNELS)}"),
    ("unknown model", set_params(model="gpt5"), ENV, "model='gpt5' is not valid; expected tiny, gpt_small, gpt2_124m, gpt2_350m, gpt2_774m, gpt2_1558m"),
    ("unknown device", set_params(device="tpu"), ENV, "expected one of: auto, cpu, cuda"),
    ("batch size not a number", set_params(shape__batch_size="abc"), ENV, "shape.batch_size='abc' is not valid; expected an integer"),
    ("zero batch size", set_params(shape__batch_size=0), ENV, "shape.batch_size=0 is not valid; expected a positive integer"),
    ("negative block size", set_params(shape__block_size=-8), ENV, "shape.block_size=-8"),
    ("context longer than the preset", set_params(shape__block_size=256), ENV, "at most 128, the context of model=tiny"),
    ("bool given as text", set_params(compile="yes"), ENV, "compile='yes' is not valid; expected true or false"),
    ("negative learning rate", set_params(optim__lr=-0.1), ENV, "optim.lr=-0.1"),
    ("float given as text", set_params(optim__lr="fast"), ENV, "optim.lr='fast' is not valid; expected a number"),
    ("too few bench steps", set_params(bench__steps=3), ENV, "bench.steps=3 is not valid; expected at least harness.warmup_steps + 2"),
    ("zero repeats", set_params(bench__repeats=0), ENV, "bench.repeats=0"),
    ("validation share too large", set_params(data__val_fraction=0.9), ENV, "data.val_fraction=0.9"),
    ("vocabulary too small", set_params(data__vocab_size=100), ENV, "data.vocab_size=100"),
    ("floor above the peak learning rate", set_params(optim__min_lr=0.5), ENV, "optim.min_lr=0.5 is not valid; expected between 0 and optim.lr"),
    ("negative warm-up", set_params(optim__lr_warmup_steps=-1), ENV, "optim.lr_warmup_steps=-1"),
    ("negative weight decay", set_params(optim__weight_decay=-0.1), ENV, "optim.weight_decay=-0.1"),
    ("negative gradient clip", set_params(optim__grad_clip=-1.0), ENV, "optim.grad_clip=-1.0 is not valid; expected 0 (off) or more"),
    ("no untimed warm-up", set_params(harness__warmup_steps=0), ENV, "harness.warmup_steps=0 is not valid; expected 1 or more"),
    ("zero steady-state tolerance", set_params(harness__steady_tolerance=0), ENV, "harness.steady_tolerance=0.0"),
    ("zero validation batches", set_params(eval__batches=0), ENV, "eval.batches=0 is not valid; expected a positive integer"),
    ("vocabulary too large for uint32", set_params(data__vocab_size=2**32 + 1), ENV, "data.vocab_size=4294967297 is not valid; expected at most 4294967296"),
    ("zero loss tolerance", set_params(aggregate__loss_tolerance=0), ENV, "aggregate.loss_tolerance=0.0"),
    ("negative repeat tolerance", set_params(aggregate__repeat_tolerance=-0.01), ENV, "aggregate.repeat_tolerance=-0.01"),
    ("zero profiled steps", set_params(profile__steps=0), ENV, "profile.steps=0 is not valid; expected a positive integer"),
    ("unknown precision in a variant", add_variant("odd", {"precision": "int8"}), ENV, "variants.odd.precision='int8' is not valid"),
    ("shell in a variant name", add_variant("foo;rm -rf x", {}), ENV, "variants='foo;rm -rf x' is not valid"),
    ("unknown knob in a variant", add_variant("turbo", {"precision": "bf16", "warp": 9}), ENV, "unknown key 'variants.turbo.warp'"),
    ("baseline not a variant", set_params(aggregate__baseline="nope"), ENV, "aggregate.baseline='nope'"),
    ("profiling an unknown variant", set_params(profile__variants=["ghost"]), ENV, "profile.variants='ghost'"),
    ("params.yaml not YAML", write_file("params.yaml", b"train: [unclosed"), ENV, "params.yaml is not valid YAML"),
    ("CUDA asked for, none present", set_params(device="cuda"), ENV, "sees no CUDA GPU; install a CUDA build of torch"),
    ("the GPU preset without CUDA", set_params(preset="gpt2_124m"), ENV, "sees no CUDA GPU; install a CUDA build of torch"),
    ("a memory cap on a CPU", set_params(harness__memory_cap_gib=24), ENV,
     "harness.memory_cap_gib=24 caps a GPU's memory, but this run is on the cpu; set harness.memory_cap_gib=0"),
    ("an unknown preset", set_params(preset="h100"), ENV, "preset='h100' is not valid; expected one of: cpu, gpt2_124m"),
    ("fp16 on CPU", set_params(precision="fp16"), TRAIN, "precision=fp16 with loss scaling needs a CUDA GPU"),
    ("fp8 on CPU", set_params(fp8="head"), TRAIN, "fp8=head needs a GPU with float8 tensor cores"),
    ("8-bit Adam on CPU", set_params(optimizer="adamw_8bit"), TRAIN, "optimizer=adamw_8bit (torchao's AdamW8bit) is timed on CUDA GPUs only"),
    ("fused loss on CPU", set_params(loss="fused"), TRAIN, "loss=fused is a Triton kernel"),
    ("clipping folded into no fused kernel", set_params(fused_clip=True), ENV,
     "fused_clip=True is not valid; expected false with optimizer=adamw (the clipping scale is handed to fused AdamW's "
     "kernel as its grad_scale; set optimizer=adamw_fused with it)"),
    ("compiled update without compile", set_params(optimizer="adamw_compiled"), ENV,
     "compile=False is not valid; expected true with optimizer=adamw_compiled, which compiles the update in compile's mode"),
    ("an optimizer knob the optimizer knob replaced", set_params(compile_update=True), ENV,
     "compile_update=True is not valid: the optimizer knob replaced fused_adamw, adam_state, compile_update and "
     "weight_dtype=bf16_sr; write optimizer: adamw_compiled"),
    ("context longer than the data", small_data, TRAIN, "shape.block_size=256 is longer than the validation split"),
    ("run that diverges", set_params(optim__lr=1e9, optim__grad_clip=0.0, optim__lr_warmup_steps=0), TRAIN,
     "training stopped: loss became nan at step"),
    ("empty corpus", write_file("corpus.txt", b"  \n\n"), PREPARE, "is empty"),
    ("binary corpus", write_file("corpus.txt", b"\x7fELF\x00\x01\x02" * 50), PREPARE, "binary, not text"),
    ("corpus not UTF-8", write_file("corpus.txt", "caf\xe9 latin-1 text".encode("latin-1")), PREPARE, "is not UTF-8 text"),
    ("missing corpus", set_params(data__corpus="nowhere.txt"), PREPARE, "data.corpus='nowhere.txt' does not exist"),
    ("missing checkpoint", lambda root: None, EVALUATE, "not found; rerun `dvc repro train`"),
    ("checkpoint that is not ours", foreign_checkpoint, EVALUATE, f"is not a {CHECKPOINT_FORMAT} checkpoint"),
    ("corrupt checkpoint", lambda r: ((r / "checkpoints").mkdir(), (r / "checkpoints/model.pt").write_bytes(b"\x00garbage" * 9)), EVALUATE, "is not a checkpoint this lab wrote"),
    ("checkpoint of random bytes", lambda r: ((r / "checkpoints").mkdir(), (r / "checkpoints/model.pt").write_bytes(os.urandom(4096))),
     EVALUATE, "is not a checkpoint this lab wrote (damaged or replaced); rerun `dvc repro train`"),
    ("checkpoint carrying code", evil_checkpoint, EVALUATE, "is not a checkpoint this lab wrote"),
    ("torch checkpoint carrying code", evil_torch_checkpoint, EVALUATE, "holds objects other than tensors"),
    ("variant results missing", lambda r: (r / "results").mkdir(), AGGREGATE, "is missing; run `dvc repro bench@fp32_baseline`"),
    # Issue 34: nothing lost, nothing silently wrong.
    ("an empty matrix", set_params(variants={}, profile__variants=[]), ENV,
     "variants={} is not valid; expected at least one variant"),
    ("a link to /dev/zero in the corpus folder", corpus_folder_with(lambda p: p.symlink_to("/dev/zero")), ENV,
     "holds texts/extra.txt, a character device (a link to /dev/zero)"),
    ("a FIFO in the corpus folder", corpus_folder_with(os.mkfifo), PREPARE,
     "holds texts/extra.txt, a FIFO (named pipe): DVC would hang reading it while hashing the corpus; remove it"),
    ("a broken link in the corpus folder", corpus_folder_with(lambda p: p.symlink_to("gone.txt")), PREPARE,
     "holds texts/extra.txt, a broken link (a link to gone.txt)"),
    ("a parquet file with a damaged data page", corrupt_parquet, PREPARE, "c.parquet has a damaged data page after row 0"),
    ("a gzip file with a damaged deflate stream", corrupt_gzip, PREPARE, "c.jsonl.gz cannot be read (Error -3 while decompressing"),
    ("token files that are empty", tokens_rewritten("val", b"", 0), TRAIN, "prep/val.bin holds no tokens"),
    ("token files of half a token", tokens_rewritten("train", b"\x01\x00\x02", 1.5), TRAIN,
     "prep/train.bin has 3 bytes, not a whole number of uint16 tokens"),
    ("weights overwritten inside an intact zip", damaged_checkpoint(os.urandom(400)), EVALUATE,
     "does not match the sha256 it carries: its weights are damaged"),
    ("weights overwritten with plausible floats", damaged_checkpoint(torch.full((100,), 0.02).numpy().tobytes()),
     EVALUATE, "does not match the sha256 it carries: its weights are damaged"),
    ("weights that give a NaN loss", checkpoint_of(nan=True), EVALUATE,
     "the validation loss of checkpoints/model.pt is nan, so nothing was recorded"),
    ("evaluating past the checkpoint's context", then_params(checkpoint_of(), shape__block_size=256),
     EVALUATE, "shape.block_size=256 is longer than the context of checkpoints/model.pt (128 tokens, model=tiny)"),
    # Issue 46: the holes a hostile user still found. Every value a message echoes is cut to its first 80 characters.
    ("a checkpoint of another preset", then_params(checkpoint_of("gpt_small"), model="tiny"), EVALUATE,
     "checkpoints/model.pt holds a model=gpt_small checkpoint, but params.yaml says model=tiny; rerun `dvc repro train` "
     "(it trains model=tiny), or set model=gpt_small"),
    # Issue 53: nothing trusted that was not measured.
    ("a checkpoint trained on another tokenizer's data", checkpoint_of(tokenizer="4096" * 16), EVALUATE,
     "checkpoints/model.pt was trained on data from another tokenizer (sha256 409640964096) than prep holds ("),
    ("a top-level key given twice", twice("seed: 1"), ENV,
     "params.yaml gives seed twice (lines "),  # tests/unit/test_params.py holds the whole message
    ("a variant given twice", twice("  recipe: {precision: bf16}", after="variants:"), ENV, "params.yaml gives variants.recipe twice"),
    ("a megabyte corpus path", set_params(data__corpus="b" * MB), ENV,
     f"data.corpus={'b' * 80!r}... (1,000,000 chars) is not a usable path: File name too long; point data.corpus"),
    ("a megabyte corpus path, prepared", set_params(data__corpus="b" * MB), PREPARE,
     f"data.corpus={'b' * 80!r}... (1,000,000 chars) is not a usable path: File name too long"),
    ("a 300-character corpus path", set_params(data__corpus="a" * 300), PREPARE,
     f"data.corpus={'a' * 80!r}... (300 chars) is not a usable path: File name too long"),
    ("a 300-character tokenizer path", set_params(data__tokenizer="t" * 300), PREPARE,
     f"data.tokenizer={'t' * 80!r}... (300 chars) is not a usable path: File name too long"),
    ("a megabyte variant name", add_variant("v" * MB, {}), ENV, f"variants={'v' * 80!r}... (1,000,000 chars) is not valid"),
    ("a megabyte key", set_params(**{"k" * MB: 1}), ENV, f"unknown key {'k' * 80!r}... (1,000,000 chars); valid keys"),
    ("a megabyte knob value", set_params(precision="p" * MB), ENV, f"precision={'p' * 80!r}... (1,000,000 chars) is not valid"),
    ("a megabyte model name", set_params(model="m" * MB), ENV, f"model={'m' * 80!r}... (1,000,000 chars) is not valid"),
    ("a megabyte preset name", set_params(preset="q" * MB), ENV, f"preset={'q' * 80!r}... (1,000,000 chars) is not valid"),
    ("a megabyte search start", set_params(search__start="s" * MB), ENV, f"search.start={'s' * 80!r}... (1,000,000 chars) is not valid"),
]


def snapshot(paths: list[str]) -> dict[str, bytes | None]:
    """Every file at or under `paths`, byte for byte (None for a path that does not exist)."""
    out: dict[str, bytes | None] = {}
    for name in paths:
        path = Path(name)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        out.update({str(f): f.read_bytes() if f.exists() else None for f in files})
    return out


def leftovers(root: Path) -> list[str]:
    """Files a stage writes aside (`.name.tmp-PID`, `.name.new-PID`) that a finished stage must not leave."""
    return [str(p) for p in root.rglob(".*") if any(mark in p.name for mark in (".tmp-", ".new-", ".old-"))]


@pytest.mark.parametrize("case, breaker, stage, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case: str, breaker, stage, message: str, workdir: Path, prepared: Path,
                   capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(prepared, workdir / "prep")
    main, argv, outputs = stage
    for out in outputs:  # an earlier run's outputs (prepare's is the prepared data): they must stay as they were
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        if not Path(out).suffix and out != "prep":
            Path(out).mkdir(exist_ok=True)
            (Path(out) / "earlier.png").write_text(f"the earlier run's {out}")
        elif out != "prep":
            Path(out).write_text(f"the earlier run's {out}")
    breaker(workdir)
    before = snapshot(outputs)
    with pytest.raises(SystemExit) as exit_info:
        run_main(main, argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err[:2000]
    assert err.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in err
    assert len(err) < 2000, f"{len(err)} characters: a value echoed whole"
    assert "weights_only" not in err  # never the unsafe advice torch's own message gives
    assert snapshot(outputs) == before, "an earlier output was changed or removed"
    assert leftovers(workdir) == []
    assert not (workdir / "PWNED").exists()


def test_out_of_memory_variant_is_recorded_and_the_matrix_goes_on(workdir: Path, prepared: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(prepared, workdir / "prep")

    def oom(*args: object, **kwargs: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setattr("benchlab.run.runner.train_step", oom)
    run_main(bench.main, ["--variant", "bf16", "prep", "results", "steps"])  # returns: no SystemExit
    record = json.loads((workdir / "results" / "bf16.json").read_text())
    assert record["status"] == "oom" and "batch size 4" in record["message"]
    assert record["env.torch"] and record["provenance.date_utc"] and record["params.precision"] == "bf16"
    assert (workdir / "steps" / "bf16.csv").read_text().startswith("step,loss")


def test_compile_without_a_compiler_is_refused(workdir: Path, prepared: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(prepared, workdir / "prep")
    set_params(compile=True)(workdir)
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(SystemExit):
        run_main(train.main, TRAIN[1])
    assert "compile=true on CPU needs a C++ compiler" in capsys.readouterr().err


def test_truncated_tokens_stop_training_before_it_starts(workdir: Path, prepared: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(prepared, workdir / "prep")
    data = (workdir / "prep" / "train.bin").read_bytes()
    (workdir / "prep" / "train.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(SystemExit):
        run_main(train.main, TRAIN[1])
    err = capsys.readouterr().err
    assert "truncated or replaced" in err and "dvc repro prepare" in err
    assert not Path("checkpoints/model.pt").exists()


@pytest.mark.parametrize("breaker, message", [
    (set_params(data__vocab_size=-3), "data.vocab_size=-3 is not valid"),
    (set_params(data__corpus="nowhere.txt"), "data.corpus='nowhere.txt' does not exist"),
    (set_params(data__corpus="a" * 300), "is not a usable path: File name too long"),
    (set_params(data__tokenizer="missing.json"), "data.tokenizer='missing.json' does not exist"),
    (twice("seed: 1"), "params.yaml gives seed twice"),
], ids=["bad vocabulary", "missing corpus", "corpus name too long", "missing tokenizer", "a key twice"])
def test_a_refused_prepare_leaves_the_earlier_prepared_data_as_it_was(breaker, message: str, workdir: Path,
                                                                       prepared: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 46: a direct `prepare` deleted data/prepared before it checked its params."""
    shutil.copytree(prepared, workdir / "prep")
    before = {p.name: p.read_bytes() for p in (workdir / "prep").iterdir()}
    breaker(workdir)
    with pytest.raises(SystemExit) as exit_info:
        run_main(prepare.main, ["prep"])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (workdir / "prep").iterdir()} == before
