"""The grading queue on a local Ray cluster (the `service` is Ray itself, started here)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from agentinfra.environments import Submission
from agentinfra.environments.kernels import KernelSettings
from agentinfra.harness import RunDirectory, RunHarness, RunSpec, make_executor, open_environment

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples" / "kernels" / "problems" / "11_slow_cumsum.py"


@pytest.mark.slow
@pytest.mark.service
def test_run_graded_on_a_local_ray_cluster(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    # ray.init sets RAY_AUTH_MODE=token in this process's environment and leaves it there; a
    # cluster started later in the session (test_rollouts_ray.py) would then demand a token its
    # service subprocess does not have. The environment is put back after the test.
    saved_environ = dict(os.environ)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        spec = RunSpec(
            run_id="ray",
            environment="kernels",
            task=str(PROBLEM),
            settings=KernelSettings(timing_pairs=6),
        )
        environment = open_environment(spec)
        run = RunDirectory.create(tmp_path / "run", spec, grader_version=environment.grader_version)
        executor = make_executor("local")
        assert executor.where == "ray:local"
        harness = RunHarness(run, environment, eval_workers=2, executor=executor)
        honest = harness.submit(
            Submission((ROOT / "examples/kernels/submissions/11_fast_cumsum.py").read_bytes()),
            source="t",
        )
        cheat = harness.submit(
            Submission((ROOT / "tests/fixtures/kernels/cheats/call_counting.py").read_bytes()),
            source="t",
        )
        asyncio.run(harness.drain())
        assert harness.state.graded[honest.sha256]["outcome"] == "passed"
        assert harness.state.graded[honest.sha256]["score"] > 5
        assert harness.state.graded[cheat.sha256]["outcome"] in ("failed", "hack_flagged")
        verdict = run.read_evaluation(honest.sha256, environment.grader_version)
        assert verdict is not None
        assert verdict.provenance["sandbox"] != "none"
        run.close()
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved_environ)
