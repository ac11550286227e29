"""`agentinfra kv serve|stats|explain|demo`: the cache server, its client, and prefill skipped."""

from __future__ import annotations

import asyncio
import json
import signal
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from agentinfra._settings import KVCacheConfig, format_size, load_settings, parse_size
from agentinfra.engines import vllm_python
from agentinfra.errors import ConfigError
from agentinfra.kvcache import (
    CacheClient,
    CacheServer,
    DiskTier,
    EventsConfig,
    MemoryTier,
    Namespace,
    RedisTier,
    ServerConfig,
    ServerThread,
    TieredStore,
    block_keys,
    load_token_file,
)

__all__ = ["register"]

console = Console()


def _read_token(token_file: Path | None) -> str:
    if token_file is None:
        return ""
    try:
        fields = token_file.read_text().split()
    except OSError as exc:
        raise ConfigError(
            f"cannot read token file {token_file}: {exc.strerror} (--token-file)"
        ) from None
    if not fields:
        raise ConfigError(f"token file {token_file} is empty (--token-file)")
    return fields[-1]


def build_store(
    settings: KVCacheConfig, *, memory: str | None = None, disk_dir: Path | None = None,
    disk: str | None = None, disk_admission: str = "write-through", redis: str | None = None,
    redis_cluster: bool = False,
) -> TieredStore:  # fmt: skip
    """The store `kv serve` serves: each option, else its ``AGENTINFRA_KV_*`` setting."""
    if disk_admission not in ("all", "second-access", "write-through"):
        raise ConfigError(
            f"--disk-admission {disk_admission!r} must be second-access, all or write-through"
        )
    memory_bytes = (
        settings.memory_capacity_bytes if memory is None else parse_size(memory, knob="--memory")
    )
    disk_bytes = settings.disk_capacity_bytes if disk is None else parse_size(disk, knob="--disk")
    folder = disk_dir or settings.disk_dir
    disk_tier = DiskTier(folder, disk_bytes) if folder else None
    remote = RedisTier(redis, cluster=redis_cluster) if redis else None
    return TieredStore(MemoryTier(memory_bytes), disk_tier, remote=remote,
                       disk_admission=disk_admission)  # type: ignore[arg-type]  # fmt: skip


def serve_command(
    host: Annotated[
        str, typer.Option(help="Address to bind; loopback unless told otherwise.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the cache protocol.")] = 7480,
    memory: Annotated[
        str | None,
        typer.Option(help="Memory tier capacity, e.g. 4GiB (default: AGENTINFRA_KV_MEMORY)."),
    ] = None,
    disk_dir: Annotated[
        Path | None,
        typer.Option(
            "--disk-dir", help="Directory of the disk tier (default: AGENTINFRA_KV_DISK_DIR)."
        ),
    ] = None,
    disk: Annotated[
        str | None, typer.Option(help="Disk tier capacity (default: AGENTINFRA_KV_DISK).")
    ] = None,
    disk_admission: Annotated[
        str,
        typer.Option(
            "--disk-admission",
            help="When blocks go to disk: second-access (evicted after reuse), all (every evicted "
            "block) or write-through (every put, so a restart keeps every acknowledged block).",
        ),
    ] = "write-through",
    redis: Annotated[
        str | None,
        typer.Option(help="Redis/Valkey URL of a shared tier, e.g. redis://127.0.0.1:6379/0."),
    ] = None,
    redis_cluster: Annotated[
        bool, typer.Option("--redis-cluster", help="The Redis URL names a cluster node.")
    ] = False,
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", help="Lines 'TENANT TOKEN'; clients must present one."),
    ] = None,
    max_frame: Annotated[
        str, typer.Option("--max-frame", help="Largest frame payload accepted.")
    ] = "256MiB",
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="Port of /metrics (Prometheus).")
    ] = 7481,
    events: Annotated[
        str | None,
        typer.Option(
            "--events",
            help="Publish the memory and disk tiers' blocks as vLLM KV events on this ZMQ "
            "address (tcp://127.0.0.1:5557), for routers such as Dynamo or llm-d.",
        ),
    ] = None,
    events_replay: Annotated[
        str | None,
        typer.Option("--events-replay", help="ZMQ ROUTER address that replays missed batches."),
    ] = None,
    shm_socket: Annotated[
        Path | None,
        typer.Option(
            "--shm-socket",
            help="Also listen on this Unix socket (mode 0600) for engines on this machine, whose "
            "loads then come through shared memory (docs/protocol.md, section 9).",
        ),
    ] = None,
    shm_max: Annotated[
        str, typer.Option("--shm-max", help="Largest shared segment one engine may hand over.")
    ] = "1GiB",
) -> None:
    """Serve a tiered KV-cache store over the agentinfra cache protocol (docs/protocol.md)."""
    if events_replay is not None and events is None:
        raise ConfigError("--events-replay needs --events (the address the events go to)")
    if metrics_port is not None and metrics_port != 0 and metrics_port == port:
        raise ConfigError(
            f"--port {port} is also the metrics port; pass another --metrics-port (default 7481)"
        )
    config = ServerConfig(
        host=host,
        port=port,
        max_frame_bytes=parse_size(max_frame, knob="--max-frame"),
        tokens=load_token_file(token_file) if token_file else None,
        metrics_port=metrics_port,
        events=None
        if events is None
        else EventsConfig(endpoint=events, replay_endpoint=events_replay),
        shm_socket=shm_socket,
        shm_max_bytes=parse_size(shm_max, knob="--shm-max"),
    )
    store = build_store(
        load_settings().kvcache, memory=memory, disk_dir=disk_dir, disk=disk,
        disk_admission=disk_admission, redis=redis, redis_cluster=redis_cluster,
    )  # fmt: skip
    remote = store.remote

    async def run() -> None:
        server = CacheServer(store, config)
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        where = f"{host}:{server.port}"
        metrics = (
            f", metrics on http://{host}:{server.metrics_port}/metrics"
            if server.metrics_port
            else ""
        )
        published = f", KV events on {server.events.endpoint}" if server.events else ""
        shared = f", shared memory on {shm_socket}" if shm_socket else ""
        console.print(
            f"kv server listening on {where}{shared}{metrics}{published}", highlight=False
        )
        await stop.wait()
        await server.close()

    try:
        asyncio.run(run())
    finally:
        store.close()
        if isinstance(remote, RedisTier):
            remote.close()


def stats_command(
    host: Annotated[str, typer.Option(help="Server address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Server port.")] = 7480,
    token_file: Annotated[
        Path | None, typer.Option("--token-file", help="File whose last word is the token.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show a running server's counters, per tier."""
    with CacheClient(host, port, token=_read_token(token_file)) as client:
        stats = client.stats()
    if as_json:
        print(json.dumps(stats, sort_keys=True))
        return
    console.print(
        f"{stats['server']['server']} on {host}:{port}: {stats['lookups']} lookups, "
        f"{stats['hit_blocks']} blocks hit, {stats['server']['connections']} connections; "
        f"misses {stats['misses_by_reason']}",
        highlight=False,
    )
    table = Table("tier", "blocks", "used", "hits", "misses", "evictions", "read", "written")
    for tier in stats["tiers"]:
        table.add_row(
            tier["name"], str(tier["blocks"]), format_size(tier["used_bytes"]), str(tier["hits"]),
            str(tier["misses"]), str(tier["evictions"]), format_size(tier["bytes_read"]), format_size(tier["bytes_written"]),
        )  # fmt: skip
    console.print(table)


def explain_command(
    tokens: Annotated[
        Path,
        typer.Argument(
            help="The prompt's token ids: a JSON list or whitespace-separated integers."
        ),
    ],
    model_id: Annotated[str, typer.Option("--model-id", help="Namespace: the model.")],
    kv_dtype: Annotated[
        str, typer.Option("--kv-dtype", help="Namespace: the KV dtype.")
    ] = "bfloat16",
    block_size: Annotated[
        int | None,
        typer.Option(
            "--block-size",
            help="Namespace: tokens per block (default: AGENTINFRA_KV_BLOCK_SIZE_TOKENS).",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Server address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Server port.")] = 7480,
    token_file: Annotated[
        Path | None, typer.Option("--token-file", help="File whose last word is the token.")
    ] = None,
) -> None:
    """Say why a prompt's prefix does not fully hit on a running server."""
    try:
        text = tokens.read_text()
        ids = json.loads(text) if text.lstrip().startswith("[") else [int(t) for t in text.split()]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read token ids from {tokens}: {exc}") from None
    size = block_size if block_size is not None else load_settings().kvcache.block_size_tokens
    namespace = Namespace(model_id=model_id, kv_dtype=kv_dtype, block_size_tokens=size)
    keys = block_keys(namespace, ids)
    with CacheClient(host, port, token=_read_token(token_file)) as client:
        result = client.explain_keys(keys)
    console.print(
        f"{result['hit_blocks']}/{result['requested_blocks']} blocks hit; {result['detail']}",
        highlight=False,
    )


def demo_command(
    tokens: Annotated[int, typer.Option(help="Prompt length in tokens.")] = 4096,
    layers: Annotated[int, typer.Option(help="Decoder layers of the random Llama model.")] = 24,
    via: Annotated[str, typer.Option(help="Where the prefix comes from: disk or server.")] = "disk",
    engine: Annotated[
        str, typer.Option(help="transformers (in process) or vllm (two vLLM engine processes).")
    ] = "transformers",
    as_json: Annotated[bool, typer.Option("--json", help="vllm: print one JSON object.")] = False,
    model_choice: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="vllm: smollm2 (the real SmolLM2-135M-Instruct of `make smollm2`, the default), random "
            "(a random Llama of --layers) or a checkpoint directory. transformers: random only.",
        ),
    ] = None,
) -> None:
    """Prefill a model twice: recomputed, then with the prefix from the cache (random ~0.5B Llama or, with
    vLLM, the real SmolLM2-135M-Instruct)."""
    if engine == "vllm":
        _vllm_demo(tokens, layers, as_json, model_choice or "smollm2")
        return
    if engine != "transformers":
        raise ConfigError(f"--engine {engine!r} must be 'transformers' or 'vllm'")
    if model_choice not in (None, "random"):
        raise ConfigError(
            f"--model {model_choice!r}: the transformers demo builds a random Llama; use --engine vllm"
        )
    import torch

    from agentinfra.engines import PrefixCachedModel, tiny_llama

    if via not in ("disk", "server"):
        raise ConfigError(f"--via {via!r} must be 'disk' or 'server'")
    torch.manual_seed(0)
    console.print(f"building a random Llama: {layers} layers, hidden 896, 14 heads, 2 KV heads ...")
    model = tiny_llama(layers=layers)
    ids = torch.randint(0, model.config.vocab_size, (tokens,))
    namespace = Namespace(
        model_id=f"random-llama-{layers}l", kv_dtype="float32", block_size_tokens=256
    )
    with tempfile.TemporaryDirectory(prefix="agentinfra-kv-demo-") as tmp:
        directory = Path(tmp) / "kv"
        writer = TieredStore(
            MemoryTier(8 << 30), DiskTier(directory, 64 << 30), disk_admission="write-through"
        )
        if via == "disk":
            cold = PrefixCachedModel(model, writer, namespace).prefill(ids)
            writer.close()
            # A fresh store over the same directory: nothing in memory, every block from disk.
            reader = TieredStore(MemoryTier(8 << 30), DiskTier(directory, 64 << 30))
            warm = PrefixCachedModel(model, reader, namespace, save=False).prefill(ids)
            reader.close()
        else:
            server = ServerThread(writer)
            try:
                with CacheClient("127.0.0.1", server.port, tenant="demo") as client:
                    cold = PrefixCachedModel(model, client, namespace).prefill(ids)
                with CacheClient("127.0.0.1", server.port, tenant="demo") as client:
                    warm = PrefixCachedModel(model, client, namespace, save=False).prefill(ids)
            finally:
                server.close()
                writer.close()
    diff = float((cold.logits - warm.logits).abs().max())
    table = Table("prefill", "tokens computed", "load", "compute", "time to first token")
    table.add_row(
        "recompute", str(cold.prompt_tokens), "-", f"{cold.compute_s:.2f} s", f"{cold.ttft_s:.2f} s"
    )
    table.add_row(
        f"prefix from {via}", str(warm.prompt_tokens - warm.cached_tokens), f"{warm.load_s * 1000:.0f} ms",
        f"{warm.compute_s * 1000:.0f} ms", f"{warm.ttft_s:.3f} s",
    )  # fmt: skip
    console.print(table)
    console.print(
        f"cached {warm.cached_tokens} of {tokens} tokens; time to first token "
        f"{warm.ttft_s / cold.ttft_s:.1%} of recompute; max |logit difference| {diff:.2e}",
        highlight=False,
    )


def run_probe(
    python: Path, model: Path, port: int, tokens: int, *extra: str
) -> tuple[dict[str, object], str]:
    """One `agentinfra.engines._vllm_probe` engine run: its JSON result and its log (vLLM's and the connector's).

    Raises:
        ConfigError: the engine failed (the tail of its output is in the message).
    """
    import json
    import os
    import subprocess

    done = subprocess.run(
        [str(python), "-m", "agentinfra.engines._vllm_probe", "--model", str(model), "--port", str(port),
         "--tokens", str(tokens), "--max-model-len", str(max(8192, tokens + 64)), *extra],
        capture_output=True, text=True, check=False,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")},
    )  # fmt: skip
    found = [line for line in done.stdout.splitlines() if line.startswith("AGENTINFRA_PROBE ")]
    if done.returncode != 0 or not found:
        tail = (done.stdout + done.stderr)[-2000:]
        raise ConfigError(f"the vLLM engine failed (exit {done.returncode}):\n{tail}")
    result: dict[str, object] = json.loads(found[-1].removeprefix("AGENTINFRA_PROBE "))
    return result, done.stdout + done.stderr


def _vllm_demo(tokens: int, layers: int, as_json: bool, which: str) -> None:
    """Two vLLM engine processes, the second loading the prefix from `kv serve`."""
    import json

    from agentinfra.engines import random_checkpoint, smollm2_dir

    python = vllm_python()
    with tempfile.TemporaryDirectory(prefix="agentinfra-vllm-demo-") as tmp:
        if which == "smollm2":
            model, name, vocab = smollm2_dir(), "SmolLM2-135M-Instruct", 49152
        elif which == "random":
            if not as_json:
                console.print(f"saving a random Llama checkpoint ({layers} layers, hidden 896) ...")
            model = random_checkpoint(Path(tmp) / "model", layers=layers, vocab=32000)
            name, vocab = f"random-llama-{layers}l", 32000
        else:
            model = Path(which)
            if not (model / "config.json").is_file():
                raise ConfigError(
                    f"--model {which!r} is not smollm2, random or a checkpoint directory"
                )
            name = model.name
            vocab = int(json.loads((model / "config.json").read_text()).get("vocab_size", 32000))
        store = TieredStore(MemoryTier(8 << 30))
        server = ServerThread(store)
        try:
            if not as_json:
                console.print(
                    f"engine 1 ({name}) computes {tokens} tokens and saves its blocks to the kv server ..."
                )
            cold, _ = run_probe(
                python, model, server.port, tokens, "--vocab", str(vocab), "--max-new", "16"
            )
            if not as_json:
                console.print("engine 2 (a fresh process) loads the prefix from the kv server ...")
            warm, _ = run_probe(
                python, model, server.port, tokens, "--vocab", str(vocab), "--max-new", "16"
            )
        finally:
            server.close()
            store.close()
    cold_lp = [float(v) for v in cold["logprobs"]]  # type: ignore[attr-defined]
    warm_lp = [float(v) for v in warm["logprobs"]]  # type: ignore[attr-defined]
    diffs = [abs(a - b) for a, b in zip(cold_lp, warm_lp, strict=False)]
    ttft_cold, ttft_cached = float(cold["ttft_s"]), float(warm["ttft_s"])  # type: ignore[arg-type]
    result = {
        "engine": "vllm", "model": name, "tokens": tokens,
        "cached_tokens": warm["cached_tokens"], "ttft_cold_s": round(ttft_cold, 4),
        "ttft_cached_s": round(ttft_cached, 4), "ratio": round(ttft_cached / ttft_cold, 4),
        "outputs_equal": cold["tokens"] == warm["tokens"], "max_logprob_diff": max(diffs, default=0.0),
    }  # fmt: skip
    if as_json:
        print(json.dumps(result))
        return
    table = Table("engine", "tokens cached", "time to first token")
    table.add_row("1: recompute", "0", f"{ttft_cold:.3f} s")
    table.add_row(
        "2: prefix from the kv server", str(warm["cached_tokens"]), f"{ttft_cached:.3f} s"
    )
    console.print(table)
    console.print(
        f"time to first token {result['ratio']:.1%} of recompute; same greedy tokens: {result['outputs_equal']}; "
        f"max |logprob difference| {result['max_logprob_diff']:.2e}",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
    app.command("stats")(stats_command)
    app.command("explain")(explain_command)
    app.command("demo")(demo_command)
