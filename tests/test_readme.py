"""The README's promises: each ```python block runs as written, and its results table is what the records give."""
import glob
import os
import re

import pytest
from conftest import import_extra

from llmkernels.bench import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "README.md")) as _f:
    README = _f.read()


def _blocks(text):
    """[(the heading above, code)] of each ```python block."""
    out, heading, code = [], "top", None
    for line in text.splitlines(keepends=True):
        if code is not None:
            if line.startswith("```"):
                out.append((heading, "".join(code)))
                code = None
            else:
                code.append(line)
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("```python"):
            code = []
    return out


BLOCKS = _blocks(README)


def test_readme_has_blocks():
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("code", [c for _, c in BLOCKS],
                         ids=[f"{i}-{h.split()[0].strip(':,')}" for i, (h, _) in enumerate(BLOCKS)])
def test_readme_block_runs(code):
    if "transformers" in code:
        import_extra("transformers", "hf")  # the llmkernels.hf block
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_block"})  # noqa: S102  (a fresh namespace)


def _records():
    return report.load(sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.json"))))


def test_readme_results_match_records():
    section = README.split("<!-- results:start -->\n")[1].split("\n<!-- results:end -->")[0]
    assert section == report.readme_section(_records()), "run `python -m llmkernels.bench.report` and commit"


def test_full_results_page_matches_records():
    with open(os.path.join(ROOT, "docs", "results.md")) as f:
        assert f.read() == report.full_page(_records()), "run `python -m llmkernels.bench.report` and commit"


def test_readme_links_exist():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if "://" not in target:
            assert os.path.exists(os.path.join(ROOT, target)), target
