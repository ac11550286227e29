"""Every cheat in the corpus graded once: its outcome, score and blocking checks.

    python benchmarks/grader/bench_cheats.py [--smoke]

Run it on two revisions to show that a change to the sandbox or the protocol
leaves the corpus's outcomes as they were. Prints one JSON line per cheat, with
``as_expected``: whether its outcome and blocking checks are those the folder's
``expected.json`` declares (None where the folder has none, or none for this cheat).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from agentinfra.environments.kernels import GradeOptions, grade

ROOT = Path(__file__).resolve().parents[2]
CHEATS = ROOT / "tests" / "fixtures" / "kernels" / "cheats"
PROBLEMS = ROOT / "examples" / "kernels" / "problems"


def as_expected(got: dict[str, Any], expected: dict[str, Any]) -> bool:
    """The declared outcome, every declared blocking check, and no block beyond those and the
    cheat's ``may_also_block`` (one of which flags even a cheat declared to pass or fail)."""
    allowed = set(expected["blocking"]) | set(expected.get("may_also_block", []))
    blocking = set(got["blocking"])
    outcome = "hack_flagged" if blocking - set(expected["blocking"]) else expected["outcome"]
    return got["outcome"] == outcome and set(expected["blocking"]) <= blocking <= allowed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument(
        "--cheats", type=Path, default=CHEATS, help="folder of cheats (another checkout's)"
    )
    args = parser.parse_args()
    cheats = sorted(args.cheats.glob("*.py"))[: 2 if args.smoke else None]
    declared = args.cheats / "expected.json"
    expected = json.loads(declared.read_text())["cheats"] if declared.is_file() else {}
    options = GradeOptions(timeout_s=60, timing_pairs=6)
    for cheat in cheats:
        match = re.search(r"# problem: (\S+)", cheat.read_text())
        if match is None:
            sys.exit(f"bench_cheats: {cheat} names no problem (a '# problem: NAME' line)")
        start = time.perf_counter()
        problem = PROBLEMS / f"{match.group(1)}.py"
        verdict = grade(
            problem.read_bytes(), cheat.read_bytes(), options, problem_name=problem.name
        )
        got = {
            "outcome": verdict.outcome.value,
            "blocking": sorted({f.check for f in verdict.blocking()}),
        }
        print(json.dumps({
            "cheat": cheat.stem, "outcome": got["outcome"], "speedup": verdict.speedup,
            "blocking": got["blocking"], "wall_s": round(time.perf_counter() - start, 1),
            "as_expected": as_expected(got, expected[cheat.stem]) if cheat.stem in expected else None,
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
