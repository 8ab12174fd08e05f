"""The docs' examples run, and print what the docs say they print.

A page opts in with a line ``<!-- example: ... -->``; from there to ``<!-- end example -->``
its ```` ```python ```` blocks run in order in one namespace (a fresh one per page), each in the
page's own process state (the random state is whatever the blocks set).  A ```` ```text ````
block right after a python block is that block's expected output: the text must match line by
line, and the numbers in it within 5% or 3 units of their last printed digit -- they are
training results, and torch versions differ in the last bits of their kernels.
"""
from __future__ import annotations

import contextlib
import io
import os
import re

import pytest
import torch

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def example_pages():
    return sorted(f for f in os.listdir(DOCS) if f.endswith(".md")
                  and "<!-- example:" in open(os.path.join(DOCS, f), encoding="utf-8").read())


def blocks(text: str):
    """[(code, expected output or None)] of the example part of a page."""
    start = text.index("<!-- example:")
    end = text.find("<!-- end example -->", start)
    part = text[start:end if end >= 0 else len(text)]
    fences = list(re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", part, re.S | re.M))
    out = []
    for i, m in enumerate(fences):
        if m.group(1) != "python":
            continue
        nxt = fences[i + 1] if i + 1 < len(fences) else None
        between = part[m.end():nxt.start()] if nxt else ""
        expected = nxt.group(2) if nxt is not None and nxt.group(1) == "text" and not between.strip() else None
        out.append((m.group(2), expected))
    return out


def _close(got: str, want: str) -> bool:
    g, w = float(got), float(want)
    unit = 10.0 ** -(len(want.split(".")[1].split("e")[0]) if "." in want else 0)
    return abs(g - w) <= max(0.05 * abs(w), 3 * unit)


def assert_output_matches(got: str, want: str, where: str):
    gl, wl = got.rstrip().splitlines(), want.rstrip().splitlines()
    assert len(gl) == len(wl), f"{where}: {len(gl)} lines printed, the docs show {len(wl)}:\n{got}"
    for g, w in zip(gl, wl):
        assert NUMBER.sub("#", g).rstrip() == NUMBER.sub("#", w).rstrip(), f"{where}: printed\n{g}\ndocs say\n{w}"
        for a, b in zip(NUMBER.findall(g), NUMBER.findall(w)):
            assert _close(a, b), f"{where}: printed {a} where the docs say {b}:\n{g}\n{w}"


def test_pages_with_examples_exist():
    assert {"getting_started.md", "optim.md"} <= set(example_pages())


def test_output_comparison_fails_on_a_wrong_number_or_word():
    assert_output_matches("accuracy 0.967 NLL 0.131", "accuracy 0.968 NLL 0.130", "ok")
    with pytest.raises(AssertionError):
        assert_output_matches("accuracy 0.867", "accuracy 0.967", "number")
    with pytest.raises(AssertionError):
        assert_output_matches("accuracy 0.967", "precision 0.967", "word")
    with pytest.raises(AssertionError):
        assert_output_matches("64-128 -> 64-73", "64-128 -> 64-93", "pruned size")


@pytest.mark.parametrize("page", example_pages())
def test_page_examples_run_and_print_what_the_page_shows(page):
    pytest.importorskip("sklearn")
    text = open(os.path.join(DOCS, page), encoding="utf-8").read()
    ns: dict = {"__name__": f"docs_{page[:-3]}"}
    threads = torch.get_num_threads()
    try:
        for k, (code, expected) in enumerate(blocks(text)):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                exec(compile(code, f"docs/{page} block {k + 1}", "exec"), ns)
            if expected is not None:
                assert_output_matches(buf.getvalue(), expected, f"docs/{page} block {k + 1}")
    finally:
        torch.set_num_threads(threads)
