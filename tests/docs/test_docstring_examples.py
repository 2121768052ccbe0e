"""The examples in the docstrings of the entry points run, and print what they say."""

from __future__ import annotations

import doctest
import tempfile

import pytest

import mmreplay

ENTRY_POINTS = [mmreplay.create_store, mmreplay.open_store, mmreplay.UniformSampler, mmreplay.PrioritizedSampler,
                mmreplay.BatchLoader]


@pytest.mark.parametrize("obj", ENTRY_POINTS, ids=lambda o: o.__name__)
def test_the_docstring_example_runs(obj, tmp_path, monkeypatch):
    if obj is mmreplay.BatchLoader:
        pytest.importorskip("torch")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the examples' stores go under tmp_path
    tests = doctest.DocTestFinder(recurse=False).find(obj, obj.__name__, globs={})
    assert tests and tests[0].examples, f"{obj.__name__} has no example in its docstring"
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
