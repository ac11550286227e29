"""vLLM's own KV-event decoder reads what the cache server publishes.

The subscriber runs in vLLM's interpreter and decodes every batch with
``msgspec.msgpack.Decoder(vllm.distributed.kv_events.KVEventBatch)``, as a
router built on vLLM's types (Dynamo's and llm-d's subscribers follow the same
schema) would, over both the live PUB socket and the replay socket.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from agentinfra.engines import vllm_python
from agentinfra.errors import ConfigError
from agentinfra.kvcache import (
    CacheClient,
    DiskTier,
    EventsConfig,
    MemoryTier,
    Namespace,
    ServerConfig,
    ServerThread,
    TieredStore,
    block_keys,
)
from agentinfra.kvcache._server import tenant_key


def _vllm() -> Path | None:
    try:
        return vllm_python()
    except ConfigError:
        return None


VLLM = _vllm()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(VLLM is None, reason="no vLLM interpreter: run `make vllm-venv`"),
]

NS = Namespace(model_id="tiny", block_size_tokens=4)
SHAPE = (2, 2, 4, 1, 8)
BLOCK_BYTES = 80 + 2 * 2 * 4 * 1 * 8 * 4

SUBSCRIBER = textwrap.dedent(
    """
    import json, sys, time
    import msgspec, zmq
    from vllm.distributed.kv_events import (
        AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher)

    pub, replay, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)

    def describe(event):
        if isinstance(event, BlockStored):
            return {"type": "stored", "medium": event.medium, "hashes": [h.hex() for h in event.block_hashes],
                    "parent": event.parent_block_hash.hex() if event.parent_block_hash else None,
                    "tokens": event.token_ids, "block_size": event.block_size,
                    "extra_keys": event.extra_keys}
        if isinstance(event, BlockRemoved):
            return {"type": "removed", "medium": event.medium,
                    "hashes": [h.hex() for h in event.block_hashes]}
        assert isinstance(event, AllBlocksCleared), type(event)
        return {"type": "cleared"}

    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub)
    print("ready", flush=True)
    live, deadline = [], time.monotonic() + 30
    while sum(e["type"] == "stored" for e in live) < want and time.monotonic() < deadline:
        if sub.poll(1000):
            _, seq, payload = sub.recv_multipart()
            live += [describe(e) for e in decoder.decode(payload).events]
    dealer = context.socket(zmq.DEALER)
    dealer.connect(replay)
    dealer.send_multipart((b"", (0).to_bytes(8, "big")))
    replayed = []
    while dealer.poll(10000):
        _, seq, payload = dealer.recv_multipart()
        if seq == ZmqEventPublisher.END_SEQ:
            break
        replayed += [describe(e) for e in decoder.decode(payload).events]
    print(json.dumps({"live": live, "replayed": replayed}), flush=True)
    """
)


def test_vllms_decoder_reads_the_servers_events(tmp_path: Path) -> None:
    assert VLLM is not None
    store = TieredStore(MemoryTier(2 * BLOCK_BYTES), DiskTier(tmp_path / "d", 10 * BLOCK_BYTES),
                        disk_admission="all")  # fmt: skip
    events = EventsConfig(
        endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", flush_s=0.01
    )
    thread = ServerThread(store, ServerConfig(port=0, tokens={"t": "acme"}, events=events))
    try:
        publisher = thread.server.events if thread.server else None
        assert publisher is not None
        assert publisher.replay_endpoint is not None
        child = subprocess.Popen(
            [str(VLLM), "-c", SUBSCRIBER, publisher.endpoint, publisher.replay_endpoint, "4"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready", (
            child.stderr.read() if child.stderr else ""
        )
        time.sleep(0.5)  # a SUB socket misses what is sent before it has joined
        tokens = list(range(16))
        keys = block_keys(NS, tokens)
        rng = np.random.default_rng(0)
        with CacheClient("127.0.0.1", thread.port, token="t") as client:
            assert client.announce(keys, tokens, block_size=4)
            client.put(keys, [rng.standard_normal(SHAPE).astype(np.float32) for _ in keys])
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err[-3000:]
        seen = json.loads(out.strip().splitlines()[-1])
    finally:
        thread.close()
    scoped = [tenant_key("acme", k).hex() for k in keys]
    for stream in ("live", "replayed"):
        cpu = [e for e in seen[stream] if e["type"] == "stored" and e["medium"] == "CPU"]
        assert [h for e in cpu for h in e["hashes"]] == scoped, stream
        assert [t for e in cpu for t in e["tokens"]] == tokens
        assert cpu[0]["parent"] is None
        assert cpu[0]["extra_keys"][0] == ["acme"]  # the tenant, as vLLM's cache_salt
        removed = [h for e in seen[stream] if e["type"] == "removed" for h in e["hashes"]]
        demoted = [h for e in seen[stream] if e.get("medium") == "STORAGE" for h in e["hashes"]]
        assert len(removed) == 2  # memory holds two of the four blocks
        assert sorted(removed) == sorted(demoted)
    assert seen["replayed"][0] == {"type": "cleared"}
