"""A real model answers a two-turn chat through vLLM, with agentinfra's KV store underneath.

    .venv/bin/python examples/kvcache/real_model_chat.py [--json]      # `make demo-vllm`

SmolLM2-135M-Instruct (`make smollm2`) is served by vLLM's OpenAI-compatible
server on the CPU, with `AgentinfraConnector` pointed at an in-process kv server.
vLLM's own prefix cache is off, so every prefix token that is not recomputed came
from the store. The first turn computes its prompt and saves its blocks; the second
turn's prompt is the first turn, its answer and a new question: its prefix is
loaded from the store. An unrelated warm-up request comes first. Both turns stream through the official ``openai`` client;
TTFT is the time to the first streamed token, cached tokens are vLLM's
``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from agentinfra.engines import SMOLLM2_NAME, VllmServer, smollm2_dir, timed_chat
from agentinfra.kvcache import MemoryTier, ServerThread, TieredStore

SYSTEM = (
    "You are a concise assistant for a GPU kernel engineering team. Answer in one or two sentences. "
    "Background for this conversation: the team grades CUDA and Triton kernels written by AI agents. Each "
    "submission is run in a sandbox, checked for correctness against a reference PyTorch model on secret "
    "inputs, and timed against the reference. A kernel that is faster but wrong scores zero. Kernels are "
    "graded on every intermediate submission, so a run that starts cheating is caught in the iteration "
    "where it starts. The team cares about memory bandwidth, arithmetic intensity and occupancy. "
) * 6
QUESTIONS = ("What is the capital of France?", "And what is the capital of Italy?")


def turn(client: openai.OpenAI, messages: list[dict[str, Any]]) -> dict[str, Any]:
    result = timed_chat(client, SMOLLM2_NAME, messages, 40)
    ttft = result["ttft_s"]
    return {"answer": result["answer"], "prompt_tokens": result["prompt_tokens"],
            "cached_tokens": result["cached_tokens"], "ttft_s": round(ttft, 3) if ttft is not None else None}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")
    parser.add_argument("--log", type=Path, default=None, help="Keep vLLM's log here.")
    args = parser.parse_args()
    model = smollm2_dir()
    store = TieredStore(MemoryTier(1 << 30))
    kv = ServerThread(store)
    say = (lambda *a: None) if args.json else print
    try:
        with tempfile.TemporaryDirectory(prefix="agentinfra-chat-") as tmp:
            say(f"starting vLLM with {SMOLLM2_NAME} and the kv store on 127.0.0.1:{kv.port} ...")
            started = time.monotonic()
            with VllmServer(model, log=args.log or Path(tmp) / "vllm.log", kv_url=f"127.0.0.1:{kv.port}",
                            served_name=SMOLLM2_NAME, tools=None, prefix_caching=False,
                            extra_args=("--enable-prompt-tokens-details",)) as server:  # fmt: skip
                say(f"vLLM answered after {time.monotonic() - started:.0f} s")
                client = openai.OpenAI(base_url=server.base_url, api_key="unused")
                turn(
                    client, [{"role": "user", "content": "Hello!"}]
                )  # warm-up: the first request is slow
                messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
                turns = []
                for question in QUESTIONS:
                    messages.append({"role": "user", "content": question})
                    result = turn(client, messages)
                    messages.append({"role": "assistant", "content": result["answer"]})
                    turns.append({"question": question, **result})
                    say(f"\nuser: {question}\nSmolLM2: {result['answer']}")
                    say(f"  prompt {result['prompt_tokens']} tokens, {result['cached_tokens']} from the store, "
                        f"time to first token {result['ttft_s']} s")  # fmt: skip
                external = server.metric("vllm:external_prefix_cache_hits_total")
        stats = store.stats()
    finally:
        kv.close()
        store.close()
    summary = {"model": SMOLLM2_NAME, "turns": turns, "external_prefix_hits": external,
               "store_blocks": stats.tiers[0].blocks}  # fmt: skip
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"\nvLLM counted {external:.0f} prefix tokens loaded from the store; it holds {stats.tiers[0].blocks} blocks"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
