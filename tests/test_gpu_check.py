"""The GPU check (``benchmarks/gpu_check.py``) on a machine without a GPU: it runs in seconds,
says "skipped: no GPU" for every step that needs CUDA, exits 0, and writes its table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_without_a_gpu_every_step_is_skipped_and_the_table_is_written(tmp_path):
    out = tmp_path / "gpu-check.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--json",
                           str(out)], capture_output=True, text=True, timeout=120,
                          env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    names = [row["step"] for row in data["steps"]]
    assert len(names) == 8 and any("HF Trainer" in n for n in names)
    assert {row["status"] for row in data["steps"]} == {"skipped: no GPU"}
    for name in names:
        assert f"{name}: skipped: no GPU" in done.stdout
    table = out.with_suffix(".md").read_text()
    assert "| step | status |" in table and "torch" in table and "skipped: no GPU" in table
