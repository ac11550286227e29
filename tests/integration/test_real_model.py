"""A real model end to end: SmolLM2-135M-Instruct (`make smollm2`) served by vLLM on the CPU, with
agentinfra's connector and kv server underneath, driven by the agent loop and the chat demo.

A 135M model does not follow a long tool prompt: it answers in prose, repeats itself, and
sometimes writes tool-call text. The tests do not script what it says; they check that
every reply, whatever it is, is handled as the loop promises (a call runs and its result
goes back, a reply with no call gets a reminder or ends the run, the budget ends it) and
that the transcript and the export are valid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentinfra.engines import SMOLLM2_NAME, VllmServer, smollm2_dir
from agentinfra.kvcache import MemoryTier, ServerConfig, ServerThread, TieredStore

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = smollm2_dir(check=False)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not MODEL_DIR.is_dir(), reason=f"{MODEL_DIR} missing: run `make smollm2`"),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmServer, ServerThread]]:
    store = TieredStore(MemoryTier(1 << 30))
    kv = ServerThread(store, ServerConfig(port=0))
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    try:
        with VllmServer(
            MODEL_DIR, log=log, kv_url=f"127.0.0.1:{kv.port}", served_name=SMOLLM2_NAME
        ) as server:
            yield server, kv
    finally:
        kv.close()
        store.close()


def events(run: Path) -> list[dict[str, Any]]:
    lines = (run / "agent" / "transcript.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def check_every_reply_was_handled(journal: list[dict[str, Any]]) -> dict[str, int]:
    """Each model reply is followed by results for all its calls, or by feedback, or by the stop."""
    kinds = {"calls": 0, "feedback": 0, "ended": 0}
    for index, event in enumerate(journal):
        if event["type"] != "model_response":
            continue
        later = journal[index + 1 :]
        upto = next((i for i, e in enumerate(later) if e["type"] == "model_response"), len(later))
        after = later[:upto]
        calls = event["data"]["calls"]
        if calls:
            answered = {e["data"]["call_id"] for e in after if e["type"] == "tool_result"}
            assert answered == {c["call_id"] for c in calls}, (event, after)
            kinds["calls"] += 1
        elif any(e["type"] == "feedback" for e in after):
            kinds["feedback"] += 1
        else:
            assert [e["type"] for e in after if e["type"] == "stopped"], (event, after)
            kinds["ended"] += 1
    return kinds


def test_a_kernels_run_against_the_real_model(
    served: tuple[VllmServer, ServerThread], tmp_path: Path
) -> None:
    server, kv = served
    problem = next((ROOT / "examples" / "kernels" / "problems").glob("01_*.py"))
    done = subprocess.run(
        [sys.executable, "-m", "agentinfra", "run", "--tasks", str(problem), "--model", SMOLLM2_NAME,
         "--base-url", server.base_url, "--runs-dir", str(tmp_path / "runs"), "--max-turns", "4", "--nudges", "8",
         "--max-output-tokens", "160", "--context-tokens", "8192", "--kv-hints", f"127.0.0.1:{kv.port}"],
        capture_output=True, text=True, timeout=900, cwd=ROOT, env={**os.environ, "OPENAI_API_KEY": "unused"},
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "runs").iterdir() if (p / "run.json").is_file()]
    journal = events(run)
    replies = [e for e in journal if e["type"] == "model_response"]
    assert len(replies) == 4
    assert all(r["data"]["usage"]["completion_tokens"] > 0 for r in replies)  # real text came back
    kinds = check_every_reply_was_handled(journal)
    assert (
        kinds["ended"] == 0
    )  # 8 reminders outlast 4 turns: the budget ends the run, not the model
    stopped = [e["data"] for e in journal if e["type"] == "stopped"]
    assert stopped[-1]["reason"] == "max_turns"
    out = tmp_path / "export.jsonl"
    exported = subprocess.run([sys.executable, "-m", "agentinfra", "export", str(run), "--out", str(out)],
                              capture_output=True, text=True, cwd=ROOT, check=False)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["model"] == SMOLLM2_NAME
    roles = [m["role"] for m in record["messages"]]
    assert roles[:2] == ["system", "user"]
    assert roles.count("assistant") == 4
    # the loop's reminders are in the training data, where the model saw them
    assert roles.count("user") == 1 + sum(1 for e in journal if e["type"] == "feedback")
    # the run's requests went through the connector (blocks saved), and as a KV session (--kv-hints) its
    # private blocks left memory when it stopped
    stats = kv._store.stats()
    assert stats.tiers[0].puts > 0
    assert stats.released > 0
    assert kv._store.sessions() == []


def test_the_chat_demo_answers_and_its_second_turn_comes_from_the_store() -> None:
    done = subprocess.run([sys.executable, "examples/kvcache/real_model_chat.py", "--json"], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    first, second = result["turns"]
    assert "Paris" in first["answer"]  # greedy decoding of the real model
    assert "Rome" in second["answer"]
    assert first["cached_tokens"] == 0
    # vLLM's own prefix cache is off: the first turn's whole blocks came from the store
    assert second["cached_tokens"] >= first["prompt_tokens"] // 32 * 32
    assert result["external_prefix_hits"] >= second["cached_tokens"]
    assert second["ttft_s"] < first["ttft_s"]
