"""docs/api.md's example runs as it stands, and prints what the page says it prints; the README
keeps the two set-up commands at its top and stays a guide of at most ~300 lines."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _example() -> str:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "docs/api.md has one runnable example"
    return blocks[0]


def test_the_api_example_runs_and_prints_what_the_page_says():
    from autopar import api

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_example(), "docs/api.md", "exec"), {"__name__": "docs_api_example"})
    lines = out.getvalue().splitlines()
    result = api.search_plans("llama3-70b", "dgx-h100", gpus=64, seq_len=8192, global_batch=128, top=3)
    chosen, est = result.chosen
    assert lines[0].startswith(f"{chosen.layout()} {est.step_time_s:.3f} s")  # the chosen plan first
    assert len([x for x in lines[:3] if x.endswith("≈") or " GiB" in x]) == 3  # three alternatives
    assert lines[3].startswith("tp8·pp4·v5 ") and lines[3].endswith(("fits", "OOM"))
    assert any(x.startswith("cp 2→1 (dp 2→4)") and " oom " in x for x in lines)  # explain's cp neighbour
    assert "['launch_megatron.sh']" in lines
    assert lines[-1].startswith("refused: invalid plan: tp 16")


def test_readme_is_a_short_guide_with_the_setup_commands_first():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    assert blocks[0].strip() == ("python3 -m venv .venv && . .venv/bin/activate && pip install . && autopar plan "
                                 "llama3-70b --cluster dgx-h100 --gpus 64 --seq-len 8192 --global-batch 128")
    assert blocks[1].strip() == ("python3 -m venv .venv && . .venv/bin/activate && pip install '.[test]' && "
                                 "pytest -q")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install --quiet '.[test]'" in ci and ci.rstrip().endswith("pytest -q -p no:cacheprovider")
    for page in ("api", "cost-model", "search", "accuracy", "architecture"):
        assert f"docs/{page}.md" in text and (ROOT / "docs" / f"{page}.md").is_file()
