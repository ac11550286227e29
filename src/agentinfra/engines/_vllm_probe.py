"""One vLLM engine, one prompt: run with vLLM's interpreter, prints one JSON line.

    .venv/vllm/bin/python -m agentinfra.engines._vllm_probe --model DIR [--port P] [--tokens N] ...

The engine is real (``vllm.LLM``, its engine core in its own process) with the
`AgentinfraConnector` pointed at ``--port`` (or no connector with
``--no-connector``). It first warms up on an unrelated prompt (``--warmup-tokens``, with the
timed requests' sampling: vLLM's first request with logprobs costs about 2 s once), then generates
greedily for the prompt of ``--tokens`` token ids drawn from ``--seed``, and
prints ``AGENTINFRA_PROBE {...}``: output tokens, their logprobs, the tokens vLLM
reports as cached, the time to first token and the whole generate time
(``--repeats N``: N prompts timed one after another, each result under ``all``).
Used by `agentinfra kv demo --engine vllm`, the vllm tests and the benchmark.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

PREFIX = "AGENTINFRA_PROBE "


def prompt_ids(tokens: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, vocab) for _ in range(tokens)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=7480)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--max-new", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--max-batched", type=int, default=2048)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--no-connector", action="store_true")
    parser.add_argument(
        "--connector", choices=("agentinfra", "example"), default="agentinfra",
        help="example: vLLM's own example disk connector (ExampleConnector), for comparison",
    )  # fmt: skip
    parser.add_argument(
        "--storage", default="/tmp/agentinfra-vllm-example", help="example: its directory"
    )
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="vLLM's kv_cache_dtype (fp8: stored as it is held).",
    )
    parser.add_argument(
        "--warmup-tokens", type=int, default=64, help="Length of the unrelated warm-up prompt."
    )
    parser.add_argument("--extra", default="{}", help="More kv_connector_extra_config, as JSON.")
    parser.add_argument(
        "--prompts", type=int, default=1, help="Prompts at once (seeds SEED, SEED+1, ...)."
    )
    parser.add_argument(
        "--num-blocks", type=int, default=None, help="KV blocks of the engine (forces preemption)."
    )
    parser.add_argument(
        "--ignore-eos", action="store_true", help="Generate --max-new tokens every time."
    )
    parser.add_argument(
        "--repeats", type=int, default=1,
        help="Timed requests one after another, prompt seeds SEED, SEED+1, ... (not with --prompts).",
    )  # fmt: skip
    args = parser.parse_args()
    if args.repeats > 1 and args.prompts > 1:
        parser.error("--repeats times one prompt at a time; leave --prompts at 1")

    from vllm import LLM, SamplingParams

    transfer: dict[str, Any] | None = None
    if not args.no_connector and args.connector == "example":
        transfer = {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": args.storage},
        }
    elif not args.no_connector:
        transfer = {
            "kv_connector": "AgentinfraConnector",
            "kv_connector_module_path": "agentinfra.engines.vllm",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {
                "url": f"127.0.0.1:{args.port}",
                **json.loads(args.extra),
            },
        }
    llm = LLM(
        model=args.model, skip_tokenizer_init=True, dtype="float32", block_size=args.block_size,
        max_model_len=args.max_model_len, max_num_batched_tokens=args.max_batched, enforce_eager=True,
        enable_prefix_caching=not args.no_prefix_caching, kv_transfer_config=transfer,
        disable_log_stats=False, num_gpu_blocks_override=args.num_blocks,
        kv_cache_dtype=args.kv_cache_dtype,
    )  # fmt: skip
    greedy = SamplingParams(
        max_tokens=args.max_new, temperature=0.0, logprobs=1, ignore_eos=args.ignore_eos
    )
    warm = {"prompt_token_ids": prompt_ids(args.warmup_tokens, args.seed + 10_000, args.vocab)}
    llm.generate([warm], greedy, use_tqdm=False)  # the timed requests' sampling, logprobs included
    timed: list[tuple[Any, float]] = []
    for batch in range(max(1, args.repeats)):
        started = time.monotonic()
        prompts = [
            {"prompt_token_ids": prompt_ids(args.tokens, args.seed + batch + i, args.vocab)}
            for i in range(args.prompts)
        ]
        outs = llm.generate(prompts, greedy, use_tqdm=False)
        elapsed = time.monotonic() - started
        timed += [(out, elapsed) for out in outs]
    results = []
    for out, elapsed in timed:
        completion = out.outputs[0]
        metrics = getattr(out, "metrics", None)
        ttft = float(getattr(metrics, "first_token_latency", 0.0) or 0.0) or None
        logprobs = [float(step[token].logprob)
                    for step, token in zip(completion.logprobs or [], completion.token_ids, strict=False)]  # fmt: skip
        results.append({"tokens": list(completion.token_ids), "logprobs": logprobs, "prompt_tokens": args.tokens,
                        "cached_tokens": int(out.num_cached_tokens or 0), "ttft_s": ttft,
                        "preemptions": int(getattr(metrics, "num_preemptions", 0) or 0),
                        "generate_s": round(elapsed, 4)})  # fmt: skip
    first = results[0]
    print(PREFIX + json.dumps({**first, "all": results} if len(results) > 1 else first), flush=True)


if __name__ == "__main__":
    main()
