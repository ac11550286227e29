"""verifiers' own `vf-eval` runs the `agentinfra-kernels` taskset against SmolLM2 served by vLLM.

verifiers 0.4.0 lives in ``.venv/verifiers`` (`make verifiers-venv`; it pins an older
openai than ours), so everything on its side runs there as a subprocess: `vf-eval` and the
taskset (integrations/verifiers). The rollout service is the real ``agentinfra rollouts
serve`` with a token file; the rewards vf-eval recorded are checked against the verdicts the
service stored for the very files SmolLM2 wrote (by grade key).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentinfra.agent import ScriptedModelServer
from agentinfra.engines import SMOLLM2_NAME
from agentinfra.environments.desktop import load_desktop_task
from agentinfra.environments.desktop._policy import DesktopPolicy, solution_moves
from agentinfra.environments.desktop._session import check_prerequisites
from agentinfra.errors import TaskEnvironmentError
from agentinfra.rollouts import grade_key

ROOT = Path(__file__).resolve().parents[2]
VF_BIN = ROOT / ".venv/verifiers/bin"
PROBLEMS = ("13_relu_scale.py", "09_mse_loss.py")
TOKEN = "vf-test-token"

needs_verifiers = pytest.mark.skipif(
    not (VF_BIN / "vf-eval").exists(), reason=f"{VF_BIN.parent} missing: run `make verifiers-venv`"
)


def _submission_module() -> Any:
    """The taskset's reply-to-file code, loaded from its file (it imports nothing from verifiers)."""
    path = ROOT / "integrations/verifiers/src/agentinfra_verifiers/_submission.py"
    spec = importlib.util.spec_from_file_location("vf_submission", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_submitted_file_is_cut_from_the_reply_as_text() -> None:
    cut = _submission_module().python_submission
    two = "a\n```python\nimport torch\n```\nthen\n```py\nclass ModelNew: pass\n```\n```\nx = 1\n```"
    assert cut(two) == b"class ModelNew: pass\n"  # the last block naming ModelNew
    assert cut("```\nx = 1\n```\n```python\ny = 2\n```") == b"y = 2\n"  # else the last block
    assert cut("class ModelNew(nn.Module): ...") == b"class ModelNew(nn.Module): ...\n"
    assert cut("") == b"\n"  # graded as the empty file it is
    assert cut("  \n ") == b"\n"


@contextlib.contextmanager
def _serve(folder: Path, *extra: str) -> Iterator[tuple[str, Path]]:
    """``agentinfra rollouts serve`` with a token file; yields its URL and state directory."""
    folder.mkdir(parents=True, exist_ok=True)
    state = folder / "state"
    tokens = folder / "tokens.txt"
    tokens.write_text(f"trainer {TOKEN}\n")
    log_path = folder / "service.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "agentinfra", "rollouts", "serve", "--port", "0",
             "--state-dir", str(state), "--token-file", str(tokens), *extra],
            stdout=log, stderr=log, cwd=ROOT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        found = None
        while found is None and time.monotonic() < deadline and process.poll() is None:
            found = re.search(
                r"serving rollouts on (http://127\.0\.0\.1:\d+)", log_path.read_text()
            )
            time.sleep(0.05)
        assert found is not None, log_path.read_text()
        yield found.group(1), state
    finally:
        process.terminate()
        process.wait(60)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    with _serve(tmp_path) as started:
        yield started


@pytest.fixture
def service_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """The service with the scripted model's key in its environment (keys never travel)."""
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with _serve(tmp_path / "service") as started:
        yield started


def _vf_eval(
    args: list[str], *, env: dict[str, str], out: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VF_BIN / "vf-eval"), "agentinfra-kernels", "--no-push", "--no-rich", "-o", str(out), *args],
        capture_output=True, text=True, env=env, cwd=out.parent, timeout=600,
    )  # fmt: skip


def _submissions(replies: list[str]) -> list[bytes]:
    """The files the taskset cut out of ``replies``, by its own code (in the verifiers venv)."""
    code = (
        "import json, sys\nfrom agentinfra_verifiers import python_submission\n"
        "print(json.dumps([python_submission(r).decode() for r in json.load(sys.stdin)]))"
    )
    done = subprocess.run([str(VF_BIN / "python"), "-c", code], input=json.dumps(replies),
                          capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    return [s.encode() for s in json.loads(done.stdout)]


def _traces(out: Path) -> list[dict[str, Any]]:
    (path,) = out.glob("*/traces.jsonl")
    return [t for line in path.read_text().splitlines() for t in json.loads(line)["traces"]]


@pytest.mark.slow
@needs_verifiers
def test_vf_eval_rewards_are_the_verdicts_agentinfra_stored(
    smollm2_vllm: str, service: tuple[str, Path], tmp_path: Path
) -> None:
    url, state = service
    problems = tmp_path / "problems"
    problems.mkdir()
    for name in PROBLEMS:
        shutil.copy(ROOT / "examples/kernels/problems" / name, problems / name)
    env = {**os.environ, "VLLM_KEY": "unused", "AGENTINFRA_ROLLOUTS_TOKEN": TOKEN}
    done = _vf_eval(
        ["-m", SMOLLM2_NAME, "--client.base-url", smollm2_vllm, "--client.api-key-var", "VLLM_KEY",
         "-n", "2", "-r", "2", "--sampling.max-tokens", "300", "--sampling.temperature", "1.0",
         "--env.taskset.problems-dir", str(problems), "--env.taskset.task.service-url", url],
        env=env, out=tmp_path / "out",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    traces = _traces(tmp_path / "out")
    assert len(traces) == 4
    replies = [(t["nodes"][-1]["message"]["content"] or "").strip() for t in traces]
    submissions = _submissions(replies)
    keys = set()
    for trace, submission in zip(traces, submissions, strict=True):
        assert trace["errors"] == [], trace["errors"]
        assert len(trace["calls"]) == 1
        assert trace["calls"][0].get("error") is None
        task = Path(trace["task"]["data"]["problem_path"])
        assert task.parent == problems
        key = grade_key("kernels", task.read_bytes(), "solution.py", submission)
        assert trace["info"]["agentinfra_grade"]["key"] == key
        stored = json.loads((state / "grades" / f"{key}.json").read_text())
        expected = (
            0.0 if stored["hack_flagged"] or stored["outcome"] != "passed" else stored["score"]
        )
        assert trace["rewards"]["speedup"]["score"] == expected
        keys.add(key)
    # every grading the service did is one a trace references, and none was done twice
    assert {p.stem for p in (state / "grades").glob("*.json")} == keys
    print("verifiers rewards:", [(t["task"]["data"]["name"], t["rewards"]["speedup"]["score"],
          t["info"]["agentinfra_grade"]["outcome"], hashlib.sha256(s).hexdigest()[:8])
          for t, s in zip(traces, submissions, strict=True)])  # fmt: skip


@pytest.mark.slow
@needs_verifiers
def test_bad_service_token_or_directory_is_one_clear_line(
    service: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = service
    code = f"""
import os
from pathlib import Path
from agentinfra_kernels import KernelsTaskset, KernelsTasksetConfig, KernelsTaskConfig
def first(**fields):
    task = KernelsTaskConfig(**fields.pop("task", {{}}))
    try:
        next(iter(KernelsTaskset(KernelsTasksetConfig(id="agentinfra-kernels", task=task, **fields))))
    except Exception as exc:
        print(type(exc).__name__ + ": " + str(exc))
    else:
        print("loaded")
first(problems_dir=Path({str(tmp_path / "nowhere")!r}), task={{"service_url": {url!r}}})
first(task={{"service_url": "http://127.0.0.1:9"}})
first(task={{"service_url": {url!r}, "token_var": "NO_SUCH_TOKEN_VAR"}})
os.environ["WRONG"] = "not-the-token"
first(task={{"service_url": {url!r}, "token_var": "WRONG"}})
os.environ["RIGHT"] = {TOKEN!r}
first(task={{"service_url": {url!r}, "token_var": "RIGHT"}})
"""
    done = subprocess.run([str(VF_BIN / "python"), "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert (
        lines[0]
        == f"ValueError: no problem directory at {tmp_path / 'nowhere'} (--env.taskset.problems-dir)"
    )
    assert lines[1].startswith(
        "ServiceError: cannot reach the agentinfra rollout service at http://127.0.0.1:9"
    )
    assert "--env.taskset.task.service-url" in lines[1]
    refused = f"ServiceError: the rollout service at {url} refused the token (401; sent "
    assert lines[2].startswith(refused + "no token: nothing in $NO_SUCH_TOKEN_VAR)")
    assert lines[3].startswith(refused + "the token in $WRONG)")
    for line in lines[2:4]:
        assert line.endswith("or name another with --env.taskset.task.token-var")
    assert lines[4] == "loaded"


@pytest.mark.slow
@needs_verifiers
def test_the_reward_is_agentinfras_and_an_infra_failure_errors_the_rollout(
    service: tuple[str, Path], tmp_path: Path
) -> None:
    """The taskset's reward method on three replies: an honest kernel (its speedup), a cheat
    (hack-flagged: 0), and a grading that times out (raised: verifiers records a TaskError)."""
    url, state = service
    problem = ROOT / "examples/kernels/problems/10_slow_rowwise_softmax.py"
    honest = (ROOT / "examples/kernels/submissions/10_fast_softmax.py").read_text()
    cheat = (ROOT / "tests/fixtures/kernels/cheats/call_counting.py").read_text()
    with _serve(tmp_path / "slow", "--grade-timeout", "0.5") as (slow_url, _):
        code = f"""
import asyncio, json, types
from agentinfra_kernels import KernelsData, KernelsTask, KernelsTaskConfig
async def reward(url, reply):
    task = KernelsTask(KernelsData(problem_path={str(problem)!r}), KernelsTaskConfig(service_url=url))
    trace = types.SimpleNamespace(last_reply=reply, info={{}})
    try:
        value = await task.speedup(task.data, trace)
    except Exception as exc:
        return {{"error": type(exc).__name__ + ": " + str(exc)}}
    return {{"reward": value, **trace.info["agentinfra_grade"]}}
async def main():
    replies = [{honest!r}, "```python\\n" + {cheat!r} + "```"]
    out = list(await asyncio.gather(*(reward({url!r}, r) for r in replies)))
    out.append(await reward({slow_url!r}, "```python\\nimport torch\\n```"))
    print(json.dumps(out))
asyncio.run(main())
"""
        env = {**os.environ, "AGENTINFRA_ROLLOUTS_TOKEN": TOKEN}
        done = subprocess.run([str(VF_BIN / "python"), "-c", code], capture_output=True,
                              text=True, timeout=600, env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    passed, cheated, failed = json.loads(done.stdout)
    stored = json.loads((state / "grades" / f"{passed['key']}.json").read_text())
    assert stored["outcome"] == "passed"
    assert passed["reward"] == stored["score"] > 1.0
    assert cheated["outcome"] == "hack_flagged"
    assert cheated["reward"] == 0.0
    assert failed["error"].startswith("ServiceError: agentinfra's grader failed (grader_error: ")
    assert "not a reward of 0" in failed["error"]


@pytest.mark.slow
@needs_verifiers
def test_vf_eval_desktop_rollouts_are_the_services_and_an_infra_failure_is_an_error(
    service_env: tuple[str, Path], tmp_path: Path
) -> None:
    """`vf-eval agentinfra-desktop`: each rollout is a whole agentinfra desktop rollout run by
    the service against the scripted computer-use model (real jailed desktop, real grader).
    os-mkdir is solved (reward 1); os-write-file's expected file needs the mirror, which this
    copy of the task has not got, so its grading is a ``grader_error``: verifiers records that
    rollout as errored, with no reward, instead of a 0."""
    try:
        check_prerequisites()
    except TaskEnvironmentError as exc:
        pytest.skip(f"no desktop here: {exc}")
    url, state = service_env
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("os-mkdir", "os-write-file"):
        shutil.copy(ROOT / f"examples/desktop/tasks/{name}.json", tasks / f"{name}.json")
    mkdir = load_desktop_task(tasks / "os-mkdir.json")
    policy = DesktopPolicy({mkdir.instruction: solution_moves(mkdir.solution())})
    env = {**os.environ, "OPENAI_API_KEY": "test-key", "AGENTINFRA_ROLLOUTS_TOKEN": TOKEN}
    with ScriptedModelServer(policy, models=["scripted-desktop"]) as model:
        done = subprocess.run(
            [str(VF_BIN / "vf-eval"), "agentinfra-desktop", "--no-push", "--no-rich",
             "-o", str(tmp_path / "out"), "-m", "scripted-desktop", "--client.base-url", model.base_url,
             "--client.api-key-var", "OPENAI_API_KEY", "-n", "2", "-r", "1",
             "--env.taskset.tasks-dir", str(tasks), "--env.taskset.task.service-url", url,
             "--env.taskset.task.max-turns", "10", "--env.taskset.task.options",
             '{"action_space": "computer_13", "observation": "a11y"}'],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    traces = {t["task"]["data"]["name"]: t for t in _traces(tmp_path / "out")}
    assert set(traces) == {"os-mkdir", "os-write-file"}
    for trace in traces.values():
        summary = trace["info"]["agentinfra_rollout"]
        stored = json.loads((state / "trajectories" / f"{summary['run_id']}.json").read_text())
        assert summary["reward"] == stored["reward"]
        assert summary["infra_failure"] == stored["infra_failure"]
    solved = traces["os-mkdir"]
    assert solved["errors"] == []
    assert solved["rewards"]["reward"]["score"] == 1.0
    failed = traces["os-write-file"]
    assert failed["info"]["agentinfra_rollout"]["infra_failure"]["kind"] == "grader_error"
    assert failed["rewards"]["reward"] is None  # no score recorded: an error, not a 0
    (error,) = failed["errors"]
    assert error["type"] == "TaskError"
    assert "an infra failure, not a reward of 0" in error["message"]
