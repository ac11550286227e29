"""Service fixtures: real `redis-server` processes on loopback ports (`.ci/run` installs Redis), and
one SmolLM2 vLLM server shared by every test that needs a plain served model."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from services import free_cluster_port, free_port, start_redis, stop


@pytest.fixture(scope="session")
def smollm2_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of SmolLM2-135M-Instruct served by vLLM (`make smollm2`), started once per session.

    Served as `agentinfra.engines.SMOLLM2_NAME` with the Hermes tool parser and no KV connector;
    tests that need another configuration start their own server.
    """
    from agentinfra.engines import SMOLLM2_NAME, VllmServer, smollm2_dir

    model = smollm2_dir(check=False)
    if not model.is_dir():
        pytest.skip(f"{model} missing: run `make smollm2`")
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with VllmServer(model, log=log, served_name=SMOLLM2_NAME) as server:
        yield server.base_url


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A fresh single-node Redis; the test may kill it (``stop``)."""
    port = free_port()
    process = start_redis(tmp_path / "redis", port)
    yield f"redis://127.0.0.1:{port}/0"
    stop(process)


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[list[tuple[int, subprocess.Popen[bytes]]]]:
    """A 3-node Redis cluster (no replicas) on loopback, created with redis-cli.

    Configured as a cache cluster should be: ``cluster-require-full-coverage no``,
    so that once a dead node is marked failed (2 s here) the others go on serving
    their own slots instead of answering CLUSTERDOWN for every key.
    """
    ports = [free_cluster_port() for _ in range(3)]
    nodes = [
        (port, start_redis(tmp_path / f"node{port}", port, "--cluster-enabled", "yes",
                           "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
                           "--cluster-require-full-coverage", "no"))
        for port in ports
    ]  # fmt: skip
    try:
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            states = [
                subprocess.run(["redis-cli", "-p", str(p), "cluster", "info"], capture_output=True,
                               text=True, timeout=5).stdout
                for p in ports
            ]  # fmt: skip
            if all("cluster_state:ok" in s for s in states):
                break
            time.sleep(0.2)
        yield nodes
    finally:
        for _, process in nodes:
            stop(process)
