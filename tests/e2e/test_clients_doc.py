"""docs/clients.md runs as written: each Python block, in order, against the session's real server (its address
and key put in place of the page's), printing what the page's comments say it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from llama_index.core import Settings

from tests.e2e.conftest import WRITE_KEY

PAGE = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
# `print(...)  # -> value`: the page promises what the line prints (its first word).
PROMISE = re.compile(r"^\s*print\(.*\)\s+#\s+->\s+(\S+)", re.M)


@pytest.fixture(scope="module")
def offline_tokenizer():
    """LlamaIndex's default tokenizer (tiktoken) fetches its vocabulary from the internet, which tests may not."""
    previous = Settings._tokenizer
    Settings.tokenizer = str.split
    yield
    Settings._tokenizer = previous


def test_the_page_has_its_examples():
    assert len(BLOCKS) == 8 and sum(len(PROMISE.findall(block)) for block in BLOCKS) == 11


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_each_example_runs_and_prints_what_it_says(number, server, offline_tokenizer, tmp_path):
    code = BLOCKS[number].replace("http://127.0.0.1:8000", server).replace("my-write-key", WRITE_KEY)
    code = code.replace('"/tmp"', repr(str(tmp_path)))
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, f"docs/clients.md block {number + 1}", "exec"), {"__name__": "__docs__"})
    printed = output.getvalue().splitlines()
    for promise in PROMISE.findall(BLOCKS[number]):
        assert any(line.split()[:1] == [promise] for line in printed), (promise, printed)
