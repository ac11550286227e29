"""The agent loop end to end: the official openai client against a scripted server on loopback.

No network and no real model: `ScriptedModelServer` speaks real HTTP and SSE. Submissions
are graded by the real grader. A live-model smoke test runs against LIVE_MODEL_URL when set, else against the real
SmolLM2-135M-Instruct served by vLLM here (`make smollm2`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentinfra.agent import (
    AgentLoop,
    EndpointLimiter,
    LoopConfig,
    ModelClient,
    Reply,
    ScriptedModelServer,
    Transcript,
    preflight,
    profile_for,
    workspace_tools,
)
from agentinfra.environments.kernels import KernelSettings
from agentinfra.errors import AgentError, ConfigError
from agentinfra.harness import RunDirectory, agent_run_spec, run_agents

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples/kernels/problems/10_slow_rowwise_softmax.py"
HONEST = (ROOT / "examples/kernels/submissions/10_fast_softmax.py").read_text()
CHEAT = (ROOT / "tests/fixtures/kernels/cheats/call_counting.py").read_text()
MODEL = "MiniMaxAI/MiniMax-M3"


def _assistants(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def _xml_call(name: str, **params: str) -> str:
    inner = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in params.items())
    return f'<minimax:tool_call>\n<invoke name="{name}">\n{inner}</invoke>\n</minimax:tool_call>'


def kernel_script(body: dict[str, Any]) -> Reply:
    """A model that reads, writes (as MiniMax XML), checks, submits an honest and a cheating file."""
    step = _assistants(body)
    if step == 0:
        return Reply(reasoning="First read the problem.", tool_calls=[("read_problem", "{}")])
    if step == 1:
        text = "The rows can use torch.softmax.\n</think>\nWriting it.\n" + _xml_call(
            "write_file", path="solution.py", content=HONEST
        )
        return Reply(content=text)
    if step == 2:
        return Reply(tool_calls=[("check", json.dumps({"path": "solution.py"}))])
    if step == 3:
        return Reply(tool_calls=[("submit", json.dumps({"path": "solution.py"})),
                                 ("write_file", json.dumps({"path": "fast.py", "content": CHEAT}))])  # fmt: skip
    if step == 4:
        return Reply(tool_calls=[("submit", json.dumps({"path": "fast.py"}))])
    if step == 5:
        return Reply(tool_calls=[("results", json.dumps({"wait_s": 300}))])
    return Reply(content="I am done.")


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentinfra", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "OPENAI_API_KEY": "test-key", **(env or {})}, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.slow
def test_agent_run_end_to_end_with_grading_and_export(tmp_path: Path) -> None:
    with ScriptedModelServer(kernel_script, models=[MODEL]) as server:
        done = _cli("run", "--tasks", str(PROBLEM), "--model", MODEL, "--base-url", server.base_url,
                    "--runs-dir", str(tmp_path / "runs"), "--concurrency", "2")  # fmt: skip
        assert done.returncode == 0, done.stderr
        requests = server.requests
    (run,) = [p for p in (tmp_path / "runs").iterdir() if (p / "run.json").is_file()]
    workspace = run / "agent" / "workspace"
    assert (workspace / "solution.py").read_text() == HONEST  # XML parameter content arrived intact
    assert (workspace / "fast.py").read_text() == CHEAT
    # Streaming was used, MiniMax sampling sent, and reasoning went back into the history unchanged.
    assert all(r["stream"] for r in requests)
    assert requests[0]["temperature"] == 1.0
    assert requests[0]["top_p"] == 0.95
    assert requests[0]["top_k"] == 40
    assert requests[1]["messages"][2]["reasoning_content"] == "First read the problem."
    assert "</think>" in requests[2]["messages"][4]["content"]
    assert [t["function"]["name"] for t in requests[0]["tools"]] == [
        "read_problem", "list_files", "read_file", "write_file", "edit_file", "check", "submit", "results"
    ]  # fmt: skip
    assert list(requests[0]["tools"][3]["function"]["parameters"]["properties"]) == [
        "path",
        "content",
    ]
    exported = _cli("export", str(run), "--format", "jsonl", "--out", str(tmp_path / "out.jsonl"))
    assert exported.returncode == 0, exported.stderr
    (record,) = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert record["schema_version"] == 4
    assert record["tokens"] == "unavailable"  # the scripted server returns no token ids
    assert record["score_unit"] == "speedup"
    assert record["model"] == MODEL
    assert record["task"] == PROBLEM.name
    assert record["sampling"] == {"temperature": 1.0, "top_p": 0.95, "extra_body": {"top_k": 40}}
    assert record["stop_reason"] == "done"
    assert record["turns"] == 7
    assert record["usage"] == {"prompt_tokens": 700, "completion_tokens": 140}
    roles = [m["role"] for m in record["messages"]]
    assert roles[:3] == ["system", "user", "assistant"]
    assert roles.count("assistant") == 7
    assert roles.count("tool") == 7
    assert record["messages"][2]["reasoning_content"] == "First read the problem."
    assert [t["function"]["name"] for t in record["tools"]][-1] == "results"
    honest, cheat = record["submissions"]
    assert honest["outcome"] == "passed"
    assert honest["reward"] == pytest.approx(honest["score"])
    assert honest["reward"] > 1.0
    assert honest["turn"] == 4
    assert cheat["outcome"] == "hack_flagged"
    assert cheat["hack_flagged"] is True
    assert cheat["reward"] == 0.0
    # one hack-flagged submission zeroes the whole run, and marks it
    assert record["hack_flagged"] is True
    assert record["reward"] == 0.0
    # The official verdicts reached the agent in later tool results.
    tool_texts = [m["content"] for m in record["messages"] if m["role"] == "tool"]
    assert "solution.py: outcome=passed" in tool_texts[-1]
    assert "fast.py: outcome=hack_flagged" in tool_texts[-1]
    check = json.loads(tool_texts[2])
    assert check["outcome"] == "passed"
    assert "agent-visible" in check["note"]


def resumable_script(state: dict[str, int]) -> Any:
    def script(body: dict[str, Any]) -> Reply:
        step = _assistants(body)
        state[f"step{step}"] = state.get(f"step{step}", 0) + 1
        if step == 0:
            return Reply(
                tool_calls=[("write_file", json.dumps({"path": "solution.py", "content": HONEST}))]
            )
        if step == 1:
            # The first time, hang (the agent is killed while waiting); on resume answer at once.
            return Reply(tool_calls=[("submit", json.dumps({"path": "solution.py"}))],
                         delay_s=120 if state["step1"] == 1 else 0)  # fmt: skip
        return Reply(content="done")

    return script


@pytest.mark.slow
def test_sigkill_mid_turn_then_resume(tmp_path: Path) -> None:
    state: dict[str, int] = {}
    with ScriptedModelServer(resumable_script(state), models=[MODEL]) as server:
        process = subprocess.Popen(
            [sys.executable, "-m", "agentinfra", "run", "--tasks", str(PROBLEM), "--model", MODEL,
             "--base-url", server.base_url, "--runs-dir", str(tmp_path / "runs"), "--no-stream"],
            env={**os.environ, "OPENAI_API_KEY": "test-key"}, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while state.get("step1", 0) < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert state.get("step1") == 1, "the agent never reached its second turn"
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
        finally:
            if process.poll() is None:
                process.kill()
        (run,) = [p for p in (tmp_path / "runs").iterdir() if (p / "run.json").is_file()]
        resumed = _cli("resume", str(run), timeout=300)
        assert resumed.returncode == 0, resumed.stderr
    events = [
        json.loads(line) for line in (run / "agent" / "transcript.jsonl").read_text().splitlines()
    ]
    types = [e["type"] for e in events]
    assert types.count("loop_started") == 1
    assert types.count("loop_resumed") == 1
    responses = [e["data"]["turn"] for e in events if e["type"] == "model_response"]
    assert responses == [1, 2, 3]  # turn 1 was not asked again
    writes = [
        e for e in events if e["type"] == "tool_started" and e["data"]["name"] == "write_file"
    ]
    assert len(writes) == 1  # and its side effect was not repeated
    assert state == {"step0": 1, "step1": 2, "step2": 1}
    assert events[-1]["type"] == "stopped"
    assert events[-1]["data"]["reason"] == "done"
    journal = [json.loads(line) for line in (run / "journal.jsonl").read_text().splitlines()]
    assert [e["type"] for e in journal].count("submission_received") == 1
    assert [e["type"] for e in journal].count("graded") == 1


# -- fast tests: the loop in process -------------------------------------------------------


def _loop(tmp_path: Path, server: ScriptedModelServer, **config: Any) -> AgentLoop:
    model = config.pop("model", MODEL)
    cfg = LoopConfig(model=model, base_url=server.base_url, **config)
    client = ModelClient(base_url=server.base_url, model=model, api_key="test-key", api_key_env="OPENAI_API_KEY",
                         profile=profile_for(model), backoff_s=0.01)  # fmt: skip
    transcript = Transcript.open(tmp_path / f"t{time.monotonic_ns()}.jsonl")
    return AgentLoop(config=cfg, client=client, tools=workspace_tools(tmp_path / "ws"), system_prompt="s",
                     task_prompt="t", transcript=transcript)  # fmt: skip


def _run(loop: AgentLoop) -> Any:
    async def go() -> Any:
        try:
            return await loop.run()
        finally:
            await loop.client.close()
            loop.transcript.close()

    return asyncio.run(go())


def _types(loop: AgentLoop) -> list[str]:
    return [e.type for e in loop.transcript.events]


def test_retries_honour_retry_after_and_5xx(tmp_path: Path) -> None:
    script = [Reply(status=429, headers={"Retry-After": "0.3"}, error="slow down"), Reply(status=500),
              Reply(status=503), Reply(content="hello")]  # fmt: skip
    with ScriptedModelServer(script, models=[MODEL]) as server:
        loop = _loop(tmp_path, server)
        started = time.monotonic()
        outcome = _run(loop)
    assert outcome.stop_reason == "done"
    retries = [e.data for e in loop.transcript.events if e.type == "retry"]
    assert [r["status"] for r in retries] == [429, 500, 503]
    assert retries[0]["wait_s"] == 0.3
    assert time.monotonic() - started >= 0.3


def test_model_mistakes_go_back_as_tool_errors(tmp_path: Path) -> None:
    big = "x" * 50_000
    script = [
        Reply(tool_calls=[("no_such_tool", "{}"), ("read_file", "{not json"), ("read_file", "[1]"),
                          ("read_file", json.dumps({"path": "../../etc/passwd"})),
                          ("write_file", json.dumps({"path": "big.txt", "content": big}))]),
        Reply(tool_calls=[("read_file", json.dumps({"path": "big.txt"}))]),
        Reply(content="ok"),
    ]  # fmt: skip
    with ScriptedModelServer(script, models=[MODEL]) as server:
        loop = _loop(tmp_path, server, stream=False, max_tool_result_chars=1000)
        assert _run(loop).stop_reason == "done"
        last = server.requests[-1]["messages"]
    results = [e.data for e in loop.transcript.events if e.type == "tool_result"]
    assert [r["is_error"] for r in results] == [True, True, True, True, False, False]
    assert "there is no tool 'no_such_tool'" in results[0]["content"]
    assert "not valid JSON" in results[1]["content"]
    assert "must be a JSON object" in results[2]["content"]
    assert "leaves the workspace" in results[3]["content"]
    assert len(results[5]["content"]) < 1200
    assert "characters omitted" in results[5]["content"]
    assert last[-1]["role"] == "tool"
    assert "characters omitted" in last[-1]["content"]


def test_text_tool_calls_and_prose_get_answers_not_a_silent_end(tmp_path: Path) -> None:
    """Real small models: Hermes JSON left in the text (good, malformed, cut off), prose with no call."""
    good = '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}\n</tool_call>'
    script = [
        Reply(content="Let me write it.\n" + good),
        Reply(
            content='<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"</tool_call>'
        ),
        Reply(content='<tool_call>\n{"name": "read_fi'),  # cut off mid-call (finish_reason length)
        Reply(content="I think the file is fine."),  # prose: one reminder (nudges=1)
        Reply(
            content="<minimax:tool_call>"
        ),  # a marker with no call in it: an error, not a reminder
        Reply(content="All done."),  # prose again: reminders used up, the run is done
    ]
    with ScriptedModelServer(script, models=["HuggingFaceTB/SmolLM2-135M-Instruct"]) as server:
        loop = _loop(
            tmp_path, server, stream=False, nudges=1, model="HuggingFaceTB/SmolLM2-135M-Instruct"
        )
        outcome = _run(loop)
        sent = server.requests[-1]["messages"]
    assert outcome.stop_reason == "done"
    assert outcome.turns == 6
    assert (tmp_path / "ws" / "a.txt").read_text() == "hi"
    results = [e.data for e in loop.transcript.events if e.type == "tool_result"]
    assert [r["is_error"] for r in results] == [False, True, True]
    assert "not valid JSON" in results[1]["content"]
    assert "read_fi" in results[2]["content"]
    feedback = [e.data["kind"] for e in loop.transcript.events if e.type == "feedback"]
    assert feedback == ["no_tool_call", "unreadable_tool_call"]
    assert [m["content"] for m in sent if m["role"] == "user"][-2].startswith(
        "Your reply called no tool"
    )
    assert sent[-1]["content"].startswith("error: your reply contains tool-call text")
    # a resumed loop rebuilds the same history, reminders included
    again = _loop(
        tmp_path, server, stream=False, nudges=1, model="HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    again.transcript = Transcript.open(loop.transcript.path)
    again._replay()
    again.transcript.close()
    assert again.messages[: len(sent)] == sent


def test_budgets_stop_the_run(tmp_path: Path) -> None:
    def forever(body: dict[str, Any]) -> Reply:
        return Reply(tool_calls=[("list_files", "{}")], prompt_tokens=1000, completion_tokens=500)

    with ScriptedModelServer(forever, models=[MODEL]) as server:
        by_turns = _loop(tmp_path, server, max_turns=3)
        assert _run(by_turns).stop_reason == "max_turns"
        by_tokens = _loop(tmp_path, server, max_tokens=4000)
        outcome = _run(by_tokens)
        assert (outcome.stop_reason, outcome.turns, outcome.usage.total) == ("max_tokens", 3, 4500)
        by_cost = _loop(
            tmp_path, server, max_cost_usd=0.01, price_in_per_mtok=2.0, price_out_per_mtok=8.0
        )
        outcome = _run(by_cost)
        assert outcome.stop_reason == "max_cost"
        assert outcome.cost_usd is not None
        assert outcome.cost_usd >= 0.01
    assert _types(by_turns)[-1] == "stopped"
    with pytest.raises(ConfigError, match="--price-in"):
        LoopConfig(model=MODEL, base_url="http://x", max_cost_usd=1.0)


def test_context_management_shortens_then_drops_old_turns(tmp_path: Path) -> None:
    calls = {"n": 0}

    def chatty(body: dict[str, Any]) -> Reply:
        step = calls["n"]  # not the history's length: trimming shortens it
        calls["n"] += 1
        if step < 8:
            return Reply(tool_calls=[("write_file", json.dumps({"path": f"f{step}.txt", "content": "y" * 3000})),
                                     ("read_file", json.dumps({"path": f"f{step}.txt"}))])  # fmt: skip
        return Reply(content="done")

    with ScriptedModelServer(chatty, models=[MODEL]) as server:
        loop = _loop(tmp_path, server, context_tokens=6000, keep_recent_turns=2)
        assert _run(loop).stop_reason == "done"
        sizes = [len(json.dumps(r["messages"])) for r in server.requests]
    trims = [e.data for e in loop.transcript.events if e.type == "context_trimmed"]
    assert trims, "the history outgrew 80% of 6000 tokens and was never trimmed"
    assert any(c["op"] == "shorten" for t in trims for c in t["changes"])
    assert any(c["op"] == "drop" for t in trims for c in t["changes"])
    assert max(sizes) < 6000 * 3.5  # 8 turns of 6 KB would be about 50 KB untrimmed
    final = server.requests[-1]["messages"]
    replayed = AgentLoop(config=loop.config, client=loop.client, tools=workspace_tools(tmp_path / "ws"),
                         system_prompt="s", task_prompt="t", transcript=loop.transcript)  # fmt: skip
    replayed._replay()
    assert replayed.messages == loop.messages  # a resume rebuilds exactly the trimmed history
    assert final[0] == {"role": "system", "content": "s"}
    assert final[1] == {"role": "user", "content": "t"}
    tool_ids = {m["tool_call_id"] for m in final if m["role"] == "tool"}
    call_ids = {c["id"] for m in final if m["role"] == "assistant" for c in m.get("tool_calls", [])}
    assert tool_ids == call_ids  # never a result without its call, or a call without its result


def test_configuration_problems_are_clear_errors_at_start(tmp_path: Path) -> None:
    with ScriptedModelServer([], models=[MODEL]) as server:
        with pytest.raises(AgentError, match=r"refused the API key.*\$OPENAI_API_KEY"):
            asyncio.run(
                preflight(
                    base_url=server.base_url,
                    model=MODEL,
                    api_key="wrong",
                    api_key_env="OPENAI_API_KEY",
                )
            )
        with pytest.raises(AgentError, match=r"does not serve model 'nope'.*--model"):
            asyncio.run(
                preflight(
                    base_url=server.base_url, model="nope", api_key="test-key", api_key_env="K"
                )
            )
        asyncio.run(
            preflight(base_url=server.base_url, model=MODEL, api_key="test-key", api_key_env="K")
        )
        assert server.requests == []  # the path probe is refused before anything is generated
        # the commonest mistake: the base URL without /v1; one line, exit 2, no run directory
        bare = server.base_url.removesuffix("/v1")
        wrong = _cli("run", "--tasks", str(PROBLEM), "--model", MODEL, "--base-url", bare,
                     "--runs-dir", str(tmp_path / "bare"), timeout=60, env={"OPENAI_API_KEY": "test-key"})  # fmt: skip
        assert wrong.returncode == 2, wrong.stderr
        assert f"try --base-url {bare}/v1" in wrong.stderr
        assert len(wrong.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "bare").exists()
        unknown = _loop(tmp_path, server, model="unknown-model")
        with pytest.raises(AgentError, match="does not know model"):
            _run(unknown)
        assert _types(unknown) == ["loop_started", "failed"]  # the journal says why it ended
    with ScriptedModelServer([], models=[MODEL]) as gone:
        dead = _loop(tmp_path, gone)
    with pytest.raises(AgentError, match=r"cannot reach.*--base-url"):  # the loop's first call, too
        _run(dead)
    with pytest.raises(AgentError, match=r"cannot reach.*--base-url"):
        asyncio.run(
            preflight(base_url="http://127.0.0.1:9/v1", model=MODEL, api_key="k", api_key_env="K")
        )
    missing = _cli("run", "--tasks", str(PROBLEM), "--model", MODEL, "--base-url", "http://127.0.0.1:9/v1",
                   "--api-key-env", "AGENTINFRA_TEST_NO_SUCH_KEY", timeout=60)  # fmt: skip
    assert missing.returncode == 2
    assert "AGENTINFRA_TEST_NO_SUCH_KEY holds no API key" in missing.stderr
    unreachable = _cli("run", "--tasks", str(PROBLEM), "--model", MODEL, "--base-url", "http://127.0.0.1:9/v1",
                       "--runs-dir", str(tmp_path / "r"), timeout=60)  # fmt: skip
    assert unreachable.returncode == 2
    assert "cannot reach http://127.0.0.1:9/v1" in unreachable.stderr
    assert not (tmp_path / "r").exists()  # nothing was created for a run that could not start


def test_many_runs_share_one_loop(tmp_path: Path) -> None:
    def quick(body: dict[str, Any]) -> Reply:
        return Reply(content="nothing to do", delay_s=0.2)

    runs = []
    config = None
    with ScriptedModelServer(quick, models=[MODEL]) as server:
        config = LoopConfig(model=MODEL, base_url=server.base_url, max_turns=5)
        for i in range(4):
            spec = agent_run_spec(f"r{i}", PROBLEM, config, KernelSettings(), environment="kernels")
            runs.append(RunDirectory.create(tmp_path / f"r{i}", spec, grader_version="1.0.0"))
        started = time.monotonic()
        states = asyncio.run(
            run_agents(
                runs, api_key="test-key", concurrency=2, limiter=EndpointLimiter(max_in_flight=2)
            )
        )
        elapsed = time.monotonic() - started
    for run in runs:
        run.close()
    assert [s.status for s in states] == ["stopped: done"] * 4
    assert elapsed >= 0.4  # 4 runs, 2 at a time, 0.2 s each
    assert all(s.turn == 1 for s in states)


@pytest.fixture
def live_endpoint(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str, str]]:
    """``(url, model, key_env)``: LIVE_MODEL_URL/LIVE_MODEL_NAME/LIVE_MODEL_KEY_ENV when set, else the real
    SmolLM2-135M-Instruct served here by vLLM (`make smollm2`; that is what CI runs against)."""
    if os.environ.get("LIVE_MODEL_URL"):
        yield (os.environ["LIVE_MODEL_URL"], os.environ["LIVE_MODEL_NAME"],
               os.environ.get("LIVE_MODEL_KEY_ENV", "OPENAI_API_KEY"))  # fmt: skip
        return
    from agentinfra.engines import SMOLLM2_NAME

    monkeypatch.setenv("AGENTINFRA_LOCAL_MODEL_KEY", "unused")
    yield request.getfixturevalue("smollm2_vllm"), SMOLLM2_NAME, "AGENTINFRA_LOCAL_MODEL_KEY"


@pytest.mark.slow
def test_live_model_smoke(tmp_path: Path, live_endpoint: tuple[str, str, str]) -> None:
    """A real endpoint answers through the same loop (LIVE_MODEL_URL, else SmolLM2 in vLLM)."""
    url, model, key_env = live_endpoint
    cfg = LoopConfig(
        model=model, base_url=url, api_key_env=key_env, max_turns=2, max_output_tokens=64
    )
    client = ModelClient(base_url=url, model=model, api_key=os.environ[key_env], api_key_env=key_env,
                         profile=profile_for(model))  # fmt: skip
    asyncio.run(
        preflight(base_url=url, model=model, api_key=os.environ[key_env], api_key_env=key_env)
    )
    loop = AgentLoop(config=cfg, client=client, tools=workspace_tools(tmp_path / "ws"), system_prompt="Be brief.",
                     task_prompt="Write hello.txt containing 'hi', then stop.",
                     transcript=Transcript.open(tmp_path / "t.jsonl"))  # fmt: skip
    outcome = _run(loop)
    assert outcome.turns >= 1
    assert outcome.usage.total > 0
    replies = [e.data for e in loop.transcript.events if e.type == "model_response"]
    assert all(r["usage"]["completion_tokens"] > 0 for r in replies)


class Crash(BaseException):
    """Stands in for kill -9 in the middle of a tool call (not caught by the loop)."""


def test_resume_in_process_reruns_only_the_unfinished_call(tmp_path: Path) -> None:
    from agentinfra.agent import Tool

    script = [
        Reply(
            tool_calls=[
                ("write_file", json.dumps({"path": "a.txt", "content": "1"})),
                ("flaky", "{}"),
            ]
        ),
        Reply(content="done"),
    ]
    runs: list[str] = []

    async def crashing(args: dict[str, Any]) -> str:
        runs.append("crash")
        raise Crash

    async def working(args: dict[str, Any]) -> str:
        runs.append("ok")
        return "fine"

    schema = {"type": "object", "properties": {}}
    path = tmp_path / "t.jsonl"
    with ScriptedModelServer(script, models=[MODEL]) as server:
        cfg = LoopConfig(model=MODEL, base_url=server.base_url, stream=False)

        def make(handler: Any) -> AgentLoop:
            client = ModelClient(base_url=server.base_url, model=MODEL, api_key="test-key", api_key_env="K",
                                 profile=profile_for(MODEL))  # fmt: skip
            tools = [*workspace_tools(tmp_path / "ws"), Tool("flaky", "A tool.", schema, handler)]
            return AgentLoop(config=cfg, client=client, tools=tools, system_prompt="s", task_prompt="t",
                             transcript=Transcript.open(path))  # fmt: skip

        with pytest.raises(Crash):
            _run(make(crashing))
        resumed = make(working)
        outcome = _run(resumed)
        assert len(server.requests) == 2  # turn 1 was not asked again
    assert outcome.stop_reason == "done"
    assert runs == ["crash", "ok"]
    types = [e.type for e in resumed.transcript.events]
    assert types.count("tool_started") == 3  # write_file once, flaky twice
    assert [e.data["name"] for e in resumed.transcript.events if e.type == "tool_result"] == [
        "write_file",
        "flaky",
    ]
    assert (tmp_path / "ws" / "a.txt").read_text() == "1"
    second = server.requests[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]


def test_first_call_to_a_server_still_starting_is_retried(tmp_path: Path) -> None:
    import socket
    import threading

    from agentinfra.agent import ModelClient, Reply

    with socket.socket() as probe:  # a free loopback port, nothing listening yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ScriptedModelServer([Reply(content="up")], models=[MODEL], port=port)
    starter = threading.Timer(0.5, server.__enter__)
    starter.start()
    retries: list[tuple[int, int | None]] = []
    client = ModelClient(base_url=f"http://127.0.0.1:{port}/v1", model=MODEL, api_key="test-key",
                         api_key_env="K", profile=profile_for(MODEL), backoff_s=0.2, max_retries=8)  # fmt: skip

    async def call() -> Any:
        try:
            return await client.complete([{"role": "user", "content": "hi"}], [], stream=False,
                                         on_retry=lambda attempt, status, wait, reason: retries.append((attempt, status)))  # fmt: skip
        finally:
            await client.close()

    try:
        done = asyncio.run(call())
    finally:
        starter.join()
        server.__exit__(None, None, None)
    assert done.message["content"] == "up"
    assert retries  # the refused connections were retried, not fatal
    assert all(status is None for _, status in retries)


def test_a_submission_made_at_close_is_graded_after_the_budget_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness leaves on the run's budget before the agent stops; what the environment submits
    at close (a desktop's final state does) is still graded before the run ends."""
    import dataclasses

    from agentinfra.environments import Submission
    from agentinfra.environments.kernels._environment import KernelEnvironment
    from agentinfra.harness._journal import Journal

    plain_setup = KernelEnvironment.agent_setup

    def with_close(self: KernelEnvironment, workspace: Path, hooks: Any) -> Any:
        async def close() -> None:
            await hooks.submit(Submission(HONEST.encode(), name="final.py"))

        return dataclasses.replace(plain_setup(self, workspace, hooks), close=close)

    monkeypatch.setattr(KernelEnvironment, "agent_setup", with_close)

    def slow(body: dict[str, Any]) -> Reply:
        return Reply(content="thinking about it", delay_s=2.5)

    with ScriptedModelServer(slow, models=[MODEL]) as server:
        config = LoopConfig(model=MODEL, base_url=server.base_url, max_turns=1, wall_hours=1 / 3600)
        spec = agent_run_spec("late", PROBLEM, config, KernelSettings(), environment="kernels")
        run = RunDirectory.create(tmp_path / "late", spec, grader_version="1.0.0")
        asyncio.run(run_agents([run], api_key="test-key", concurrency=1, limiter=EndpointLimiter()))
        run.close()
    types = [e.type for e in Journal.read(tmp_path / "late" / "journal.jsonl")]
    assert types.index("run_finished") < types.index("submission_received")  # left on its budget
    assert types.count("graded") == 1
