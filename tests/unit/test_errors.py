"""errors: a user value echoed in a message is cut to a short form; the machine's limits read as one line."""

from benchlab.core.errors import cut, exhausted, shown


def test_a_short_value_is_shown_whole_and_a_long_one_by_its_start_and_length() -> None:
    assert shown("tiny") == "'tiny'" and shown(3) == "3" and shown(None) == "None"
    assert shown("b" * 80) == repr("b" * 80)  # the limit itself: whole
    assert shown("b" * 81) == f"{'b' * 80!r}... (81 chars)"
    assert shown("b" * 1_000_000) == f"{'b' * 80!r}... (1,000,000 chars)"
    assert shown(["x"] * 100) == f"{repr(['x'] * 100)[:80]}... (500 chars)"  # any value: its repr, cut
    assert shown("abc", limit=2) == "'ab'... (3 chars)"


def test_cut_keeps_text_at_the_limit_and_cuts_past_it() -> None:
    assert cut("a" * 80) == "a" * 80
    assert cut("a" * 300) == f"{'a' * 80}... (300 chars)"
    assert cut("abcdef", 3) == "abc... (6 chars)"


def test_a_native_library_that_cannot_be_mapped_under_a_memory_limit_is_out_of_memory() -> None:
    err = ImportError("/venv/tokenizers/tokenizers.abi3.so: failed to map segment from shared object")
    assert exhausted(err) == ("out of memory: raise the memory limit (ulimit -v) or free memory (ImportError: "
                              "/venv/tokenizers/tokenizers.abi3.so: failed to map segment from shared object)")
    assert exhausted(ImportError("No module named 'tokenizers'")) is None  # a missing package is not the machine's
