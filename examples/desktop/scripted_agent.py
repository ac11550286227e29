"""A desktop agent run end to end without a model: a scripted computer-use policy plays the model.

Starts `ScriptedModelServer` on loopback with `DesktopPolicy`, which reads each
screenshot's stated size, checks the image, finds cell B5 in the accessibility
table and clicks it, then types a formula, saves and calls done. It runs the real
`agentinfra run --env desktop` (a jailed Xvfb desktop with LibreOffice Calc, the
real grader) and writes the run report with its filmstrip.

    python examples/desktop/scripted_agent.py OUT_DIR

Needs root and the desktop packages (`scripts/system-deps.sh desktop`, `make
desktop-venv`); without them it prints why and exits 0, so the demo goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agentinfra.agent import ScriptedModelServer
from agentinfra.environments.desktop import load_desktop_task
from agentinfra.environments.desktop._policy import CALC_PLANS, DesktopPolicy
from agentinfra.environments.desktop._session import check_prerequisites
from agentinfra.errors import TaskEnvironmentError

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples/desktop/tasks/calc-total.json"
MODEL = "scripted-vision"


def main() -> None:
    out = Path(sys.argv[1])
    try:
        check_prerequisites()
    except TaskEnvironmentError as exc:
        print(f"desktop demo skipped: {exc}")
        return
    policy = DesktopPolicy({load_desktop_task(TASK).instruction: CALC_PLANS["calc-total"]})
    env = {**os.environ, "OPENAI_API_KEY": "demo-key"}
    with ScriptedModelServer(policy, models=[MODEL], api_key="demo-key") as server:
        subprocess.run([sys.executable, "-m", "agentinfra", "run", "--env", "desktop", "--tasks", str(TASK),
                        "--model", MODEL, "--base-url", server.base_url, "--runs-dir", str(out), "--no-stream",
                        "--action-space", "computer_use", "--keep-screenshots", "3"], env=env, check=True)  # fmt: skip
    if policy.violations:
        raise SystemExit(f"the scripted policy saw something wrong: {policy.violations}")
    (run,) = [p for p in out.iterdir() if (p / "run.json").is_file()]
    (summary,) = out.glob("summaries/*/summary.html")
    (evaluation,) = [json.loads(p.read_text()) for p in (run / "evaluations").rglob("*.json")]
    print(f"desktop run {run.name}: {evaluation['outcome']}, score {evaluation['score']}, "
          f"{policy.images_checked} screenshots checked; report: {run / 'report.html'}; summary: {summary}")  # fmt: skip


if __name__ == "__main__":
    main()
