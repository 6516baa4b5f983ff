"""The framework how-to pages show the example code the tests run, word for word.

Every code block of docs/how-to/{django,flask,fastapi,testing}.md whose first line
names a file (``# examples/...``) must appear, as written, in that file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["django.md", "flask.md", "fastapi.md", "testing.md"]
BLOCK = re.compile(r"```(?:python|toml)\n# (examples/\S+)\n(.*?)```", re.DOTALL)


def blocks(page: str) -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "how-to" / page).read_text(encoding="utf-8")
    return BLOCK.findall(text)


@pytest.mark.parametrize("page", PAGES)
def test_every_example_block_is_in_its_file(page: str) -> None:
    found = blocks(page)
    assert found, f"{page} shows no example file"
    for path, code in found:
        assert code in (ROOT / path).read_text(encoding="utf-8"), f"{page}: {path} drifted"


@pytest.mark.parametrize("page", PAGES)
def test_the_page_is_linked_from_the_index(page: str) -> None:
    assert f"(how-to/{page})" in (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
