"""One vLLM engine serving batches of prompts over stdin/stdout: run with vLLM's interpreter.

    .venv/vllm/bin/python -m agentinfra.engines._vllm_cases --model DIR [--port P | --no-connector] ...

The correctness matrix (`benchmarks/kvcache/bench_layout_matrix.py`) starts one
of these per engine setting and sends it batches while it changes the store
between them (seeds, corrupts, randomises), so that an engine starts once per
setting, not once per case. Each stdin line is a JSON request::

    {"cases": [{"prompt": [ids...], "salt": "tenant-a" | null}, ...], "max_new": 4}

and each answer is one stdout line ``agentinfra-cases {"results": [...]}``, a
result per case in order: greedy tokens, their logprobs, the tokens vLLM reports
as cached, and the request's preemptions. All cases of a request go to
``LLM.generate`` at once, so they run concurrently. A line ``{"quit": true}``
or the end of stdin stops the engine. Before the first batch the engine reports
``agentinfra-cases {"ready": true}``, or, if it fails to start,
``agentinfra-cases {"error": "..."}`` and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

PREFIX = "agentinfra-cases "


def _say(payload: dict[str, Any]) -> None:
    print(PREFIX + json.dumps(payload), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=7480)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--max-batched", type=int, default=8192)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--num-blocks", type=int, default=None)
    parser.add_argument("--max-seqs", type=int, default=256)
    parser.add_argument("--no-connector", action="store_true")
    parser.add_argument(
        "--prefix-caching", action="store_true", help="vLLM's own prefix cache on (a reference)."
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-cache-dtype", default="auto", help="vLLM's kv_cache_dtype, e.g. fp8.")
    parser.add_argument(
        "--attention-backend", default=None, help="vLLM's backend name, e.g. CPU_MLA."
    )
    parser.add_argument("--extra", default="{}", help="More kv_connector_extra_config, as JSON.")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    transfer: dict[str, Any] | None = None
    if not args.no_connector:
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
    try:
        llm = LLM(
            model=args.model, skip_tokenizer_init=True, dtype=args.dtype, block_size=args.block_size,
            max_model_len=args.max_model_len, max_num_batched_tokens=args.max_batched,
            enforce_eager=True, enable_prefix_caching=args.prefix_caching, kv_transfer_config=transfer,
            num_gpu_blocks_override=args.num_blocks, max_num_seqs=args.max_seqs,
            disable_log_stats=False, kv_cache_dtype=args.kv_cache_dtype,
            attention_config={"backend": args.attention_backend} if args.attention_backend else None,
        )  # fmt: skip
    except Exception as error:  # the engine's own refusal, or ours, as the caller's one line
        _say({"error": f"{type(error).__name__}: {error}"})
        sys.exit(1)
    _say({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("quit"):
            break
        greedy = SamplingParams(
            max_tokens=int(request.get("max_new", 4)), temperature=0.0, logprobs=1, ignore_eos=True
        )
        prompts: list[Any] = []
        for case in request["cases"]:
            prompt: dict[str, Any] = {"prompt_token_ids": case["prompt"]}
            if case.get("salt"):
                prompt["cache_salt"] = case["salt"]
            prompts.append(prompt)
        outs = llm.generate(prompts, greedy, use_tqdm=False)
        results = []
        for out in outs:
            completion = out.outputs[0]
            metrics = getattr(out, "metrics", None)
            logprobs = [float(step[token].logprob)
                        for step, token in zip(completion.logprobs or [], completion.token_ids, strict=False)]  # fmt: skip
            results.append({"tokens": list(completion.token_ids), "logprobs": logprobs,
                            "cached_tokens": int(out.num_cached_tokens or 0),
                            "preemptions": int(getattr(metrics, "num_preemptions", 0) or 0)})  # fmt: skip
        _say({"results": results})


if __name__ == "__main__":
    main()
