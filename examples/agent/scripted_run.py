"""An agent run end to end without a model: a scripted OpenAI-compatible server plays the model.

Starts `ScriptedModelServer` on loopback with a script that reads the problem, writes
an honest kernel (as MiniMax XML tool calls, with reasoning), checks it, submits it,
waits for the official score and stops. It then runs the real `agentinfra run` (the
official openai client, streaming, the real grader) and `agentinfra export`.

    python examples/agent/scripted_run.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentinfra.agent import Reply, ScriptedModelServer

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples/kernels/problems/11_slow_cumsum.py"
SOLUTION = (ROOT / "examples/kernels/submissions/11_fast_cumsum.py").read_text()
MODEL = "MiniMaxAI/MiniMax-M3"


def script(body: dict[str, Any]) -> Reply:
    step = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if step == 0:
        return Reply(reasoning="Read the reference first.", tool_calls=[("read_problem", "{}")])
    if step == 1:
        return Reply(
            content="The loop is a cumulative sum; torch.cumsum does it in one call.\n</think>\n"
            '<minimax:tool_call>\n<invoke name="write_file">\n<parameter name="path">solution.py</parameter>\n'
            f'<parameter name="content">{SOLUTION}</parameter>\n</invoke>\n</minimax:tool_call>'
        )
    if step == 2:
        return Reply(tool_calls=[("check", json.dumps({"path": "solution.py"}))])
    if step == 3:
        return Reply(tool_calls=[("submit", json.dumps({"path": "solution.py"}))])
    if step == 4:
        return Reply(tool_calls=[("results", json.dumps({"wait_s": 300}))])
    return Reply(content="Submitted torch.cumsum; done.")


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/demo-agent")
    env = {**os.environ, "OPENAI_API_KEY": "test-key"}
    with ScriptedModelServer(script, models=[MODEL]) as server:
        subprocess.run(
            [sys.executable, "-m", "agentinfra", "run", "--tasks", str(PROBLEM), "--model", MODEL,
             "--base-url", server.base_url, "--runs-dir", str(out), "--max-turns", "10"],
            check=True, env=env,
        )  # fmt: skip
    runs = sorted(p for p in out.iterdir() if (p / "run.json").is_file())
    subprocess.run(
        [sys.executable, "-m", "agentinfra", "export", str(runs[-1]), "--out", str(out / "export.jsonl")],
        check=True,
    )
    record = json.loads((out / "export.jsonl").read_text().splitlines()[0])
    sub = record["submissions"][0]
    print(
        f"agent run {record['run_id']}: {record['turns']} turns, stop={record['stop_reason']}, "
        f"submission {sub['sha256'][:12]} {sub['outcome']} at {sub['score']:.1f}x, reward {record['reward']:.1f}; "
        f"{len(record['messages'])} messages exported to {out / 'export.jsonl'}"
    )


if __name__ == "__main__":
    main()
