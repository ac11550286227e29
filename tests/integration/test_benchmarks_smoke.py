"""The benchmarks' --smoke modes run and print well-formed JSON lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize(
    "script",
    ["bench_lookup.py", "bench_replay.py", "bench_transfer.py", "bench_get_under_put.py",
     "bench_load_path.py", "bench_tier_hits.py"],
)  # fmt: skip
def test_kvcache_benchmark_smoke(script: str, tmp_path: Path) -> None:
    args = [sys.executable, script, "--smoke"]
    if script == "bench_replay.py":
        args += ["--plot", str(tmp_path / "plot.png")]
    out = subprocess.run(
        args,
        cwd=ROOT / "benchmarks" / "kvcache",
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert records
    assert all("git" in r and "python" in r for r in records)
    if script == "bench_lookup.py":
        assert records[0]["leading_hits_ms"] > 0
    elif script == "bench_tier_hits.py":
        paths = {(r["block_size"], r["path"]) for r in records}
        expected = {"tier_hits_full", "tier_hits_miss", "leading_hits_full", "block_keys"}
        assert paths == {(size, p) for size in (128, 256) for p in expected}
        for r in records:
            assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
    elif script == "bench_get_under_put.py":
        assert records[0]["gets"] > 0
        assert records[0]["get_p50_ms"] <= records[0]["get_p99_ms"] <= records[0]["get_max_ms"]
        assert records[0]["put_mb_per_s"] > 0
    elif script == "bench_transfer.py":
        paths = {r["path"] for r in records}
        assert {"raw_socket", "server_get_into", "redis_tier_get", "disk_tier_get_into"} <= paths
        assert all(r["gb_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] for r in records)
    elif script == "bench_load_path.py":
        paths = {(r["block_bytes"], r["path"]) for r in records}
        expected = {"raw_socket_8", "client_get_8", "raw_get_prefix", "loader", "loader_staged",
                    "loader_before", "loader_shm"}  # fmt: skip
        assert paths == {(size, p) for size in (256 * 1024, 2 << 20) for p in expected}
        for r in records:
            assert r["gb_per_s_min"] <= r["gb_per_s"] <= r["gb_per_s_max"]
            if r["path"] == "loader":  # received in place: no copy stage
                assert r["stages_s"]["copy_s"] == 0
                assert r["stages_s"]["get_wait_s"] > 0
            if r["path"] == "loader_shm":  # written into the segment, then copied out
                assert r["stages_s"]["copy_s"] > 0
    else:
        hit = [r for r in records if r["bench"] == "replay_hit_rate"]
        assert all(0 <= r["hit_rate"] <= r["belady_hit_rate"] + 1e-9 for r in hit)
        assert (tmp_path / "plot.png").stat().st_size > 1000


@pytest.mark.slow
def test_false_flag_benchmark_smoke() -> None:
    out = subprocess.run(
        [sys.executable, "bench_false_flags.py", "--smoke"],
        cwd=ROOT / "benchmarks" / "grader",
        capture_output=True,
        text=True,
        timeout=300,
    )
    records = [json.loads(line) for line in out.stdout.splitlines()]
    summary = records[-1]
    assert summary["bench"] == "false_flags"
    assert summary["gradings"] == 2
    assert summary["outcomes"] == {"passed": 2}, summary["not_passed"]
    assert out.returncode == 0


@pytest.mark.slow
def test_jail_benchmark_smoke() -> None:
    from agentinfra.sandbox import probe_sandbox_mode

    if probe_sandbox_mode() not in ("namespaces+uid", "userns"):
        pytest.skip("no namespaces on this machine")
    out = subprocess.run(
        [sys.executable, "bench_jail.py", "--smoke"],
        cwd=ROOT / "benchmarks" / "grader", capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    records = {r["timing"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert records["jail build (jailed - plain)"]["median_ms"] > 0
    assert records["worker, jailed: start to loaded (torch imported)"]["median_ms"] > 0


@pytest.mark.slow
def test_cheat_benchmark_smoke() -> None:
    out = subprocess.run(
        [sys.executable, "bench_cheats.py", "--smoke"],
        cwd=ROOT / "benchmarks" / "grader", capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(records) == 2
    assert all(r["outcome"] != "passed" for r in records), records


@pytest.mark.slow
def test_pairs_benchmark_smoke() -> None:
    """The reference graded against itself: raw pairs per grading, then the estimators' spread."""
    out = subprocess.run(
        [sys.executable, "bench_pairs.py", "--self", "--repeats", "2", "11_slow_cumsum"],
        cwd=ROOT / "benchmarks" / "grader", capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    *gradings, summary = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(gradings) == 2
    for grading in gradings:
        assert len(grading["ref"]) == len(grading["cand"]) >= 6
        assert 0.5 < grading["speedup"] < 2.0, grading  # the reference against itself
    assert summary["gradings"] == 2
    assert 0.5 < summary["per-pair median (the grader's)"]["median"] < 2.0


@pytest.mark.slow
def test_rollouts_benchmark_smoke() -> None:
    """A group of 2 honest kernels through `agentinfra rollouts serve`: 2 trajectories, both graded, neither flagged."""
    out = subprocess.run(
        [sys.executable, "benchmarks/rollouts/bench_rollouts.py", "--smoke"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (record,) = [json.loads(line) for line in out.stdout.splitlines()]
    assert (record["part"], record["rollouts"], record["infra_failures"]) == ("throughput", 2, 0)
    assert record["outcomes"] == ["passed", "passed"], record
    assert record["hack_flagged"] == 0
    assert record["calls"] == 8
    assert 0 < record["grading_share_of_wall"] <= 1


HUB_PROBLEM = """import torch
from transformers import AutoConfig, AutoModelForCausalLM

class Model(torch.nn.Module):
    def __init__(self, model_name, config):
        super().__init__()
        self.model = AutoModelForCausalLM.from_pretrained(model_name, config=config)

    def forward(self, x):
        return self.model(x).logits

model_name = "agentinfra-test/not-a-model"
config = AutoConfig.from_pretrained(model_name)

def get_inputs():
    return [torch.randint(0, 10, (1, 8))]

def get_init_inputs():
    return [model_name, config]
"""


@pytest.mark.slow
def test_kernelbench_sweep_two_workers_resumes_and_lists_hub_problems(tmp_path: Path) -> None:
    """A checkout shaped like KernelBench's: two problems graded two at a time, a level-4-like
    problem listed as unsupported without being run, and a second run that grades nothing."""
    checkout = tmp_path / "KernelBench"
    (checkout / "level1").mkdir(parents=True)
    (checkout / "level4").mkdir()
    examples = ROOT / "examples" / "kernels" / "problems"
    for index, name in enumerate(("13_relu_scale.py", "07_gelu_bias_scale.py"), start=1):
        (checkout / "level1" / f"{index}_{name[3:]}").write_bytes((examples / name).read_bytes())
    (checkout / "level4" / "1_hub_model.py").write_text(HUB_PROBLEM)
    out = tmp_path / "sweep.json"
    command = [sys.executable, "benchmarks/grader/kernelbench_sweep.py", str(tmp_path),
               "--levels", "1,4", "--workers", "2", "--timeout-s", "120", "--out", str(out)]  # fmt: skip

    def sweep(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *extra], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
        )

    first = sweep()
    assert first.returncode == 0, first.stderr
    assert (
        sum(line.startswith("[") for line in first.stdout.splitlines()) == 3
    )  # a progress line each
    rows = {r["problem"]: r for r in json.loads(out.read_text())["rows"]}
    assert [rows[f"level1/{n}"]["class"] for n in ("1_relu_scale.py", "2_gelu_bias_scale.py")] == [
        "passed",
        "passed",
    ]
    hub = rows["level4/1_hub_model.py"]
    assert hub["class"] == "unsupported"
    assert hub["seconds"] is None  # never run
    assert "agentinfra-test/not-a-model" in hub["why"]
    assert "not cached" in hub["why"]
    assert "transformers" in hub["why"]
    again = sweep()
    assert again.returncode == 0, again.stderr
    assert "resuming: 3 problems done earlier" in again.stdout
    assert not any(line.startswith("[") for line in again.stdout.splitlines())
    summary = json.loads(again.stdout.splitlines()[-1])
    assert (summary["passed"], summary["unsupported"], summary["workers"]) == (2, 1, 2)
    other = sweep("--timeout-s", "60")
    assert other.returncode != 0
    assert "--fresh" in other.stderr
