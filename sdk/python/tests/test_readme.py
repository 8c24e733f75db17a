"""The README's Python samples, run as written against the test service (its
address given as LEDGER_URL, which `Ledger()` reads)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def samples() -> List[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_the_readme_has_a_quickstart_and_an_errors_sample() -> None:
    found = samples()
    assert len(found) >= 2, found
    assert len(found[0].strip().splitlines()) <= 15, "the quickstart is at most 15 lines"


@pytest.mark.parametrize("n", range(len(samples())))
def test_each_readme_sample_runs_as_written(n: int, service, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / f"sample{n}.py"
    script.write_text(samples()[n])
    env = {**os.environ, "LEDGER_URL": service.url}
    env.pop("LEDGER_TOKEN", None)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "a sample prints what it shows"
    if n == 0:
        assert done.stdout.startswith("succeeded"), done.stdout
    if n == 1:
        assert done.stdout.startswith("422 queue"), done.stdout
