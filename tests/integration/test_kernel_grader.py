"""End-to-end grading: honest work passes, every cheat is caught, bad input gets the right outcome.

Each grading starts a reference worker and a sandboxed candidate worker (real
processes, real namespaces where the machine allows).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from services import sandboxed_processes

from agentinfra.environments import Outcome, Submission
from agentinfra.environments.kernels import (
    ENVIRONMENT,
    GradeOptions,
    KernelSettings,
    Verdict,
    grade,
    grade_async,
)
from agentinfra.environments.kernels._workers import WORKER_DISTRIBUTIONS
from agentinfra.errors import TaskEnvironmentError
from agentinfra.sandbox import probe_sandbox_mode, python_runtime_paths, system_library_paths

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "examples" / "kernels" / "problems"
SUBMISSIONS = ROOT / "examples" / "kernels" / "submissions"
CHEATS = ROOT / "tests" / "fixtures" / "kernels" / "cheats"
BAD = ROOT / "tests" / "fixtures" / "kernels" / "bad"
QUICK = GradeOptions(timeout_s=60, timing_pairs=6)

HONEST = {
    "01_matmul_relu_addmm": "01_matmul_relu",
    "02_softmax_manual": "02_softmax",
    "03_layernorm_manual": "03_layernorm",
    "05_conv2d_functional": "05_conv2d",
    "06_attention_sdpa": "06_attention",
    "10_fast_softmax": "10_slow_rowwise_softmax",
    "11_fast_cumsum": "11_slow_cumsum",
    "12_log_sum": "12_log_sum_positive",
}


def grade_files(problem: Path, submission: Path, options: GradeOptions) -> Verdict:
    """`grade` on two files' bytes, the problem named by its path (as `agentinfra grade` does)."""
    return grade(problem.read_bytes(), submission.read_bytes(), options, problem_name=str(problem))


def sandbox_uids() -> set[int]:
    return {uid for _, uid in sandboxed_processes()}


@pytest.mark.slow
@pytest.mark.parametrize(("submission", "problem"), sorted(HONEST.items()))
def test_honest_submissions_pass(submission: str, problem: str) -> None:
    verdict = grade_files(PROBLEMS / f"{problem}.py", SUBMISSIONS / f"{submission}.py", QUICK)
    assert verdict.outcome is Outcome.PASSED, verdict.model_dump_json(indent=1)
    assert verdict.correct
    assert verdict.speedup is not None
    assert verdict.speedup_ci is not None
    assert verdict.speedup_ci[0] <= verdict.speedup <= verdict.speedup_ci[1]
    assert verdict.baseline_ms
    assert verdict.candidate_ms
    assert verdict.utilisation is not None
    assert verdict.utilisation.roofline_fraction > 0
    assert verdict.utilisation.bytes_per_s > 0
    if problem.startswith(("10_", "11_")):
        assert verdict.speedup >= 5, (
            f"genuine speedup on an inefficient reference: {verdict.speedup:.2f}"
        )
    else:
        assert verdict.speedup < 5


EXPECTED_CHEATS: dict[str, dict[str, Any]] = json.loads((CHEATS / "expected.json").read_text())[
    "cheats"
]
"""Each cheat's outcome and blocking checks, from the last recorded corpus run (the file says which)."""


def test_every_cheat_declares_its_outcome_and_blocking_checks() -> None:
    assert sorted(EXPECTED_CHEATS) == sorted(p.stem for p in CHEATS.glob("*.py"))
    for expected in EXPECTED_CHEATS.values():
        assert Outcome(expected["outcome"])
        assert expected["blocking"] == sorted(set(expected["blocking"]))
        assert bool(expected["blocking"]) == (expected["outcome"] == "hack_flagged")
        assert not set(expected.get("may_also_block", [])) & set(expected["blocking"])


@pytest.mark.slow
@pytest.mark.parametrize("cheat", sorted(CHEATS.glob("*.py")), ids=lambda p: p.stem)
def test_cheats_get_their_expected_outcome_and_blocking_checks(cheat: Path) -> None:
    """Through the environment seam, as the harness grades: the task and the cheat travel as bytes.

    Each cheat must get the outcome and the blocking checks it is declared to get: one that
    fails for an unrelated reason fails this test. A check in its ``may_also_block`` may block
    as well (it measures the same thing the declared check does); no other may.
    """
    problem = re.search(r"# problem: (\S+)", cheat.read_text())
    assert problem is not None
    environment = ENVIRONMENT.create(
        ENVIRONMENT.load_task(PROBLEMS / f"{problem.group(1)}.py"),
        KernelSettings(timeout_s=QUICK.timeout_s, timing_pairs=QUICK.timing_pairs),
    )
    evaluation = asyncio.run(environment.evaluate(Submission(cheat.read_bytes(), name=cheat.name)))
    if evaluation.outcome is Outcome.PASSED:
        # Only a hack that is harmless under fresh inputs may pass, and then without inflation:
        # its speedup reads about 1x (not its interval's top: six pairs' noise alone once gave
        # overhead_inflation 1.08x [0.99, 1.57])
        assert evaluation.score_ci is not None
        assert evaluation.score is not None
        assert evaluation.score < 1.5, evaluation.model_dump_json(indent=1)
        assert evaluation.score_ci[0] < 1.2, evaluation.model_dump_json(indent=1)
    assert evaluation.outcome is not Outcome.GRADER_ERROR, evaluation.error
    assert evaluation.score_unit == "speedup"
    got = {
        "outcome": evaluation.outcome.value,
        "blocking": sorted({f.check for f in evaluation.findings if f.severity == "block"}),
    }
    expected = EXPECTED_CHEATS[cheat.stem]
    allowed = set(expected["blocking"]) | set(expected.get("may_also_block", []))
    # a check it may also trip makes even a cheat declared harmless a flagged one
    also = set(got["blocking"]) - set(expected["blocking"])
    want = "hack_flagged" if also else expected["outcome"]
    assert got["outcome"] == want, evaluation.model_dump_json(indent=1)
    assert set(expected["blocking"]) <= set(got["blocking"]) <= allowed, evaluation.model_dump_json(
        indent=1
    )
    assert sandbox_uids() == set(), "a candidate process outlived its grading"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("missing_modelnew", Outcome.INVALID),
        ("syntax_error", Outcome.INVALID),
        ("import_error", Outcome.INVALID),
        ("wrong_constructor", Outcome.INVALID),
        ("infinite_loop", Outcome.TIMEOUT),
        ("segfault", Outcome.CRASHED),
        ("memory_bomb", Outcome.CRASHED),
    ],
)
def test_bad_submissions(name: str, expected: Outcome) -> None:
    options = GradeOptions(timeout_s=12, timing_pairs=6, memory_limit_bytes=3 << 30)
    verdict = grade_files(PROBLEMS / "01_matmul_relu.py", BAD / f"{name}.py", options)
    assert verdict.outcome is expected, verdict.model_dump_json(indent=1)
    assert verdict.error
    if expected is Outcome.INVALID:
        assert len(verdict.error.splitlines()) <= 3


@pytest.mark.slow
def test_fork_bomb_is_contained() -> None:
    options = GradeOptions(timeout_s=12, timing_pairs=6, max_processes=32)
    verdict = grade_files(PROBLEMS / "01_matmul_relu.py", BAD / "fork_bomb.py", options)
    assert verdict.outcome in (Outcome.TIMEOUT, Outcome.CRASHED)
    assert sandbox_uids() == set()


@pytest.mark.slow
def test_candidate_cannot_see_the_problem_the_supervisor_or_the_network(tmp_path: Path) -> None:
    if probe_sandbox_mode() == "rlimits-only":
        pytest.skip("no namespaces on this machine")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import glob, os, socket, torch, torch.nn as nn\n"
        "SEEN = glob.glob('/tmp/agentinfra-grade-*') + glob.glob('/tmp/**/problem.py', recursive=True)\n"
        f"SEEN += glob.glob({str(PROBLEMS)!r} + '/*.py')\n"
        "PIDS = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
        "    SEEN.append('network')\n"
        "except OSError:\n"
        "    pass\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self, i, o):\n"
        "        super().__init__()\n"
        "        self.linear = nn.Linear(i, o)\n"
        "    def forward(self, x):\n"
        "        out = torch.relu(self.linear(x))\n"
        "        # honest only if it could see nothing of the grader: a visible file or process fails it\n"
        "        return out if not SEEN and len(PIDS) < 5 else out * 0\n"
    )
    try:
        verdict = grade_files(PROBLEMS / "01_matmul_relu.py", probe, QUICK)
    finally:
        server.close()
    assert verdict.outcome is Outcome.PASSED, verdict.model_dump_json(indent=1)


@pytest.fixture
def other_run() -> Iterator[Path]:
    """Another run's directory in the checkout, as a concurrent run leaves it: a passing kernel, its verdict."""
    run = ROOT / "runs" / f"plagiarism-target-{secrets.token_hex(4)}"
    (run / "submissions").mkdir(parents=True)
    (run / "evaluations").mkdir()
    shutil.copyfile(SUBMISSIONS / "01_matmul_relu_addmm.py", run / "submissions" / "0001-kernel.py")
    (run / "evaluations" / "0001.json").write_text('{"outcome": "passed"}')
    try:
        yield run
    finally:
        shutil.rmtree(run, ignore_errors=True)


@pytest.mark.slow
def test_the_candidate_sees_only_its_allowlisted_root(tmp_path: Path, other_run: Path) -> None:
    if probe_sandbox_mode() == "rlimits-only":
        pytest.skip("no namespaces on this machine")
    home = Path("/home") / f"planted-{secrets.token_hex(4)}"
    home.mkdir()
    (home / "secret.txt").write_text("secret")
    targets = [ROOT / "pyproject.toml", ROOT / "src" / "agentinfra" / "__init__.py", home / "secret.txt",
               other_run / "submissions" / "0001-kernel.py", other_run / "evaluations" / "0001.json"]  # fmt: skip
    allowed = {
        p.split("/")[1] for p in python_runtime_paths(WORKER_DISTRIBUTIONS) + system_library_paths()
    }
    allowed |= {"dev", "etc", "proc", "tmp", "opt"}
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os, torch, torch.nn as nn\n"
        f"ALLOWED, TARGETS = {sorted(allowed)!r}, {[str(t) for t in targets]!r}\n"
        "extra = sorted(set(os.listdir('/')) - set(ALLOWED))\n"
        "readable = [t for t in TARGETS if os.access(t, os.R_OK)]\n"
        "if extra or readable:\n"
        "    raise RuntimeError(f'outside the allowlist: {extra}; readable: {readable}')\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self, i, o):\n"
        "        super().__init__()\n"
        "        self.linear = nn.Linear(i, o)\n"
        "    def forward(self, x):\n"
        "        return torch.relu(self.linear(x))\n"
    )
    try:
        assert all(os.access(t, os.R_OK) for t in targets), (
            "the planted files must be readable outside"
        )
        verdict = grade_files(PROBLEMS / "01_matmul_relu.py", probe, QUICK)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert verdict.outcome is Outcome.PASSED, verdict.error


@pytest.mark.slow
def test_a_kernel_copied_from_another_run_gets_no_passing_verdict(other_run: Path) -> None:
    if probe_sandbox_mode() == "rlimits-only":
        pytest.skip("no namespaces on this machine")
    cheat = CHEATS / "copy_other_run.py"
    namespace: dict[str, object] = {}
    finder = cheat.read_text().split("_COPIES = ")[0]
    exec(
        compile(finder, str(cheat), "exec"), namespace
    )  # the cheat's own search, run outside the jail
    assert str(other_run / "submissions" / "0001-kernel.py") in namespace["find_kernels"](str(ROOT))  # type: ignore[operator]
    verdict = grade_files(PROBLEMS / "01_matmul_relu.py", cheat, QUICK)
    assert verdict.outcome is Outcome.INVALID, verdict.model_dump_json(indent=1)
    assert "no other run's kernel to copy" in (verdict.error or "")


def test_grade_async_returns_a_verdict() -> None:
    verdict = asyncio.run(
        grade_async(
            (PROBLEMS / "01_matmul_relu.py").read_bytes(),
            (BAD / "syntax_error.py").read_bytes(),
            QUICK,
        )
    )
    assert verdict.outcome is Outcome.INVALID
    assert verdict.provenance.submission_sha256


def test_grade_takes_bytes_and_names_the_problem_in_its_errors() -> None:
    source = (SUBMISSIONS / "01_matmul_relu_addmm.py").read_bytes()
    with pytest.raises(TypeError, match="takes the problem_source as bytes, not PosixPath"):
        grade(PROBLEMS / "01_matmul_relu.py", source, QUICK)  # type: ignore[arg-type]
    with pytest.raises(
        TaskEnvironmentError, match=r"^problem task\.py lacks Model, get_init_inputs, get_inputs"
    ):
        grade(b"import torch\n", source, QUICK, problem_name="task.py")


def test_cli_grade_json_contract(tmp_path: Path) -> None:
    env = {**os.environ, "AGENTINFRA_GRADER_TIMEOUT_S": "60"}
    out = subprocess.run(
        [sys.executable, "-m", "agentinfra", "grade", str(PROBLEMS / "11_slow_cumsum.py"), str(BAD / "syntax_error.py"), "--json"],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)
    assert verdict["schema_version"] == 1
    assert verdict["outcome"] == "invalid"
    missing = subprocess.run(
        [sys.executable, "-m", "agentinfra", "grade", str(tmp_path / "nope.py"), str(BAD / "syntax_error.py"), "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    assert missing.stdout == ""
    assert len(missing.stderr.strip().splitlines()) == 1
    assert "nope.py" in missing.stderr


@pytest.mark.gpu
def test_gpu_grading_path() -> None:
    options = GradeOptions(device="cuda", timeout_s=120)
    verdict = grade_files(
        PROBLEMS / "01_matmul_relu.py", SUBMISSIONS / "01_matmul_relu_addmm.py", options
    )
    assert verdict.outcome is Outcome.PASSED, verdict.model_dump_json(indent=1)
    assert verdict.provenance.device == "cuda"


@pytest.mark.slow
def test_concurrent_gradings_with_the_same_seed_all_pass() -> None:
    """The agent-visible check always uses one seed; three at once must not share a sandbox uid."""
    options = GradeOptions(timing_pairs=5, correctness_seeds=1, seed=20_251_129, timeout_s=120)
    problem = (PROBLEMS / "11_slow_cumsum.py").read_bytes()
    submission = (SUBMISSIONS / "11_fast_cumsum.py").read_bytes()

    async def together() -> list[Outcome]:
        verdicts = await asyncio.gather(
            *(grade_async(problem, submission, options) for _ in range(3))
        )
        return [v.outcome for v in verdicts]

    assert asyncio.run(together()) == [Outcome.PASSED] * 3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("submission", "expected"),
    [(SUBMISSIONS / "02_softmax_manual.py", Outcome.PASSED), (CHEATS / "pool_tamper.py", Outcome.PASSED),
     (CHEATS / "zeros.py", Outcome.FAILED)],
    ids=lambda value: getattr(value, "stem", str(value)),
)  # fmt: skip
def test_workers_started_without_the_fork_server_grade_alike(
    submission: Path, expected: Outcome
) -> None:
    """The exec path (``fork_server=False``; CUDA and machines without namespaces take it too).

    A cheat may also trip the checks its ``may_also_block`` lists (pool_tamper's thread spins
    while inputs are staged), which flags it, as in the corpus test."""
    verdict = grade_files(
        PROBLEMS / "02_softmax.py", submission, dataclasses.replace(QUICK, fork_server=False)
    )
    blocking = {f.check for f in verdict.findings if f.severity == "block"}
    also = set(EXPECTED_CHEATS.get(submission.stem, {}).get("may_also_block", []))
    if blocking and blocking <= also:
        expected = Outcome.HACK_FLAGGED
    assert verdict.outcome is expected, verdict.model_dump_json(indent=1)
    if expected is not Outcome.FAILED:
        assert verdict.speedup is not None
        assert verdict.speedup < 1.5
    assert sandbox_uids() == set(), "a candidate process outlived its grading"


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "exec"])
def test_both_workers_start_with_the_allocator_tunables(
    monkeypatch: pytest.MonkeyPatch, fork_server: bool
) -> None:
    """Decision 0034: a worker whose environment lost `_workers.GLIBC_TUNABLES` is named, not timed silently."""
    from agentinfra.environments.kernels import _workers

    options = dataclasses.replace(QUICK, fork_server=fork_server)
    verdict = grade_files(PROBLEMS / "02_softmax.py", SUBMISSIONS / "02_softmax_manual.py", options)
    assert verdict.outcome is Outcome.PASSED, verdict.model_dump_json(indent=1)
    assert not [f for f in verdict.findings if "allocator" in f.message], verdict.findings
    if fork_server:
        return  # the zygote already started keeps its environment; the exec path reads it afresh
    monkeypatch.setattr(_workers, "GLIBC_TUNABLES", "glibc.malloc.tcache_count=7")
    lost = grade_files(PROBLEMS / "02_softmax.py", SUBMISSIONS / "02_softmax_manual.py", options)
    warned = [
        f for f in lost.findings if f.check == "timing_environment" and "allocator" in f.message
    ]
    assert len(warned) == 1, lost.findings
    assert "tcache_count=7" in warned[0].evidence
    assert sandbox_uids() == set()


def test_a_fork_server_that_fails_is_a_grader_error_naming_the_knob(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from agentinfra.environments.kernels import _grader, _worker_calls
    from agentinfra.sandbox import ForkServer

    broken = ForkServer(preload=(("agentinfra_no_such_module", ""),), target="x:y", env={},
                        log_path=tmp_path / "forkserver.log")  # fmt: skip
    monkeypatch.setattr(_worker_calls, "worker_fork_server", lambda threads: broken)
    if _grader.probe_sandbox_mode() not in ("namespaces+uid", "userns"):
        pytest.skip("no namespaces: workers are never forked")
    with pytest.raises(TaskEnvironmentError, match="AGENTINFRA_GRADER_FORK_SERVER=0"):
        grade_files(PROBLEMS / "02_softmax.py", SUBMISSIONS / "02_softmax_manual.py", QUICK)
    assert sandbox_uids() == set()


def test_a_reference_reply_over_the_frame_limit_is_named_not_called_a_death(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reference alive, its 4 MiB reply over the frame limit: the refusal says so (KernelBench's
    level2/2 once read "the reference process died during gen: exit status None")."""
    from agentinfra.environments.kernels import _workers

    monkeypatch.setattr(
        _workers, "MAX_REPLY_BYTES", 1 << 20
    )  # the reader's limit, not the refusal's
    verdict = grade_files(PROBLEMS / "02_softmax.py", SUBMISSIONS / "02_softmax_manual.py", QUICK)
    assert verdict.outcome is Outcome.GRADER_ERROR
    assert verdict.error is not None
    assert verdict.error.startswith("the reference's reply to gen could not be read: "), (
        verdict.error
    )
    assert "frame too large" in verdict.error


@pytest.mark.parametrize(
    ("submission", "outcome", "blocking"),
    [(SUBMISSIONS / "10_fast_softmax.py", Outcome.PASSED, set()),
     (CHEATS / "precompute_untimed.py", Outcome.HACK_FLAGGED, {"staging"})],
    ids=["honest", "precompute_untimed"],
)  # fmt: skip
def test_inputs_too_large_for_one_pool_are_timed_from_fresh_pools(
    monkeypatch: pytest.MonkeyPatch, submission: Path, outcome: Outcome, blocking: set[str]
) -> None:
    """A pool that holds one batch: each batch's inputs come from a pool made again from fresh
    seeds (a round), every pair is still timed, and a cheat that works ahead on a staged batch
    is caught as with one pool."""
    from agentinfra.environments.kernels import _timing

    rounds: list[int] = []
    new_round = _timing.TimingRun._new_round

    def counted(self: Any, plan: Any, first_batch: int, batches_in_all: int) -> list[int]:
        rounds.append(first_batch)
        return new_round(self, plan, first_batch, batches_in_all)

    monkeypatch.setattr(_timing, "POOL_BYTES_LIMIT", 1)
    monkeypatch.setattr(_timing.TimingRun, "_new_round", counted)
    verdict = grade_files(PROBLEMS / "10_slow_rowwise_softmax.py", submission, QUICK)
    assert verdict.outcome is outcome, verdict.model_dump_json(indent=1)
    assert {f.check for f in verdict.findings if f.severity == "block"} == blocking
    if outcome is Outcome.PASSED:
        # one round a batch: the warm-up's pairs (2, or more while a side faulted pages in) and the timed
        assert rounds == list(range(len(rounds))), rounds
        assert len(rounds) >= QUICK.timing_pairs + 2, rounds
        assert verdict.timed_calls == QUICK.timing_pairs
    assert sandbox_uids() == set()


def test_the_warm_up_goes_on_while_a_side_still_faults_pages_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A candidate whose heap grows over its first calls (KernelBench's level2/20 faulted up to
    524,256 pages in a timed call after one warm-up pair) gets more warm-up, not a timed cold call."""
    from agentinfra.environments.kernels import _timing

    kept: list[_timing.Measurements] = []
    run = _timing.TimingRun.run

    def keep(self: Any) -> _timing.Measurements:
        kept.append(run(self))
        return kept[-1]

    monkeypatch.setattr(_timing.TimingRun, "run", keep)
    growing = tmp_path / "growing.py"
    growing.write_text(
        (SUBMISSIONS / "02_softmax_manual.py").read_text()
        + "\n\n_held = []\n_forward = ModelNew.forward\n\n"
        "def _growing(self, *args):\n"
        "    if 8 <= len(_held) < 40:  # from the timing's first batches on: 4 MiB of fresh pages a call\n"
        "        _held.append(bytearray(4 << 20))\n"
        "    else:\n"
        "        _held.append(None)\n"
        "    return _forward(self, *args)\n\n"
        "ModelNew.forward = _growing\n"
    )
    verdict = grade_files(PROBLEMS / "02_softmax.py", growing, QUICK)
    assert verdict.outcome is Outcome.PASSED, verdict.model_dump_json(indent=1)
    assert kept[0].warmup_pairs > 2
    assert kept[0].warmup_pairs <= 2 + _timing.MAX_EXTRA_WARMUP
    assert len(kept[0].ref_times) == QUICK.timing_pairs
