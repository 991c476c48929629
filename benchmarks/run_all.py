"""`make bench`: run every benchmark, each in its own process, and write
benchmarks/results/<machine-kind>.json plus the ratio table in benchmarks/README.md.

    python benchmarks/run_all.py [--quick] [--only latency,allreduce,...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import HERE, RESULTS, engine_env, machine, machine_kind
from _summary import SECTIONS, render_markdown, summarize

SHORT_IN_MAKE_BENCH = {"metrics", "trackers"}  # trackers' full form: ~4 min on 2 cores
MARK_BEGIN = "<!-- results:begin -->"
MARK_END = "<!-- results:end -->"


def run_section(name: str, script: str, quick: bool) -> dict:
    """Run one benchmark script; its JSON output, or an error record."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{name}.json"
        args = [sys.executable, str(HERE / script), "--json", str(out)] + (["--quick"] if quick else [])
        started = time.perf_counter()
        done = subprocess.run(args, capture_output=True, text=True, cwd=HERE)
        elapsed = time.perf_counter() - started
        print(f"== {name}: {elapsed:.0f} s (exit {done.returncode})")
        print("\n".join(line for line in done.stdout.splitlines()
                        if not line.startswith(("[rank", "run ", "  rank"))))
        if done.returncode != 0 or not out.exists():
            return {"error": done.stderr[-4000:], "elapsed_s": elapsed}
        data = json.loads(out.read_text())
        # A script may write the whole results layout or only its section.
        data = data.get("sections", {}).get(name, data)
        data["elapsed_s"] = elapsed
        return data


def update_readme(table: str) -> None:
    readme = HERE / "README.md"
    text = readme.read_text()
    begin, end = text.index(MARK_BEGIN) + len(MARK_BEGIN), text.index(MARK_END)
    readme.write_text(text[:begin] + "\n" + table + "\n" + text[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    parser.add_argument("--only", default="", help="comma-separated section names")
    args = parser.parse_args(argv)
    engine_env()
    wanted = {s for s in args.only.split(",") if s}
    target = RESULTS / f"{machine_kind()}.json"
    results = json.loads(target.read_text()) if target.exists() else {}
    results["machine"] = machine()
    sections = results.setdefault("sections", {})
    started = time.perf_counter()
    for name, script in SECTIONS:
        if wanted and name not in wanted:
            continue
        if not (HERE / script).exists():
            print(f"== {name}: {script} missing, skipped")
            continue
        # The metrics section's full form (10 s loops) alone takes over 10 minutes on 2 cores:
        # `make bench` runs its short form to stay within 15 minutes; run it alone for more.
        sections[name] = run_section(name, script, args.quick or name in SHORT_IN_MAKE_BENCH)
        # Written after every section: an interrupted run keeps what it measured.
        results["total_s"] = time.perf_counter() - started
        RESULTS.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(results, indent=2, sort_keys=True, default=float) + "\n")
    table = render_markdown(results["machine"], summarize(sections))
    (RESULTS / f"{machine_kind()}.md").write_text(table + "\n")
    update_readme(table)
    print(table)
    print(f"wrote {target} in {results['total_s']:.0f} s")
    return 0 if not any("error" in s for s in sections.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
