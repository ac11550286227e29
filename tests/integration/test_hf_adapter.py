"""Prefill skipped in a real transformers model (random weights, built from a config)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentinfra.engines import PrefixCachedModel, tiny_llama
from agentinfra.errors import ConfigError
from agentinfra.kvcache import DiskTier, MemoryTier, Namespace, TieredStore


@pytest.fixture(scope="module")
def model() -> object:
    return tiny_llama(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256, vocab=1000)


def full_logits(model: object, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids.unsqueeze(0)).logits[0, -1]  # type: ignore[operator, no-any-return]


def test_cached_prefix_gives_the_same_logits(model: object, tmp_path: Path) -> None:
    ns = Namespace(model_id="tiny", kv_dtype="float32", block_size_tokens=32)
    store = TieredStore(
        MemoryTier(64 << 20), DiskTier(tmp_path / "kv", 64 << 20), disk_admission="write-through"
    )
    torch.manual_seed(1)
    prompt = torch.randint(0, 1000, (200,))
    cold = PrefixCachedModel(model, store, ns).prefill(prompt)
    assert (cold.cached_tokens, cold.saved_blocks) == (0, 6)
    torch.testing.assert_close(cold.logits, full_logits(model, prompt))
    longer = torch.cat([prompt, torch.randint(0, 1000, (50,))])
    warm = PrefixCachedModel(model, store, ns).prefill(longer)
    assert warm.cached_tokens == 192  # 6 full blocks of the shared prefix
    assert warm.saved_blocks == 1  # block 6 is new; the rest is a partial block
    torch.testing.assert_close(warm.logits, full_logits(model, longer), rtol=1e-4, atol=1e-4)
    assert warm.cache.get_seq_length() == 250
    store.close()
    # A fresh store on the same directory (a restarted engine) serves the prefix from disk.
    reopened = TieredStore(MemoryTier(64 << 20), DiskTier(tmp_path / "kv", 64 << 20))
    again = PrefixCachedModel(model, reopened, ns, save=False).prefill(longer[:224])
    assert again.cached_tokens == 223  # all 7 blocks, minus the last token that must be computed
    torch.testing.assert_close(again.logits, full_logits(model, longer[:224]), rtol=1e-4, atol=1e-4)
    assert reopened.stats().promotions == 7
    reopened.close()


def test_mismatched_namespace_is_refused(model: object) -> None:
    with pytest.raises(ConfigError, match="kv_dtype"):
        PrefixCachedModel(model, TieredStore(MemoryTier(1 << 20)), Namespace(model_id="tiny"))
    other = tiny_llama(layers=1, hidden=128, heads=4, kv_heads=2, intermediate=256, vocab=1000)
    ns = Namespace(model_id="same-name-by-mistake", kv_dtype="float32", block_size_tokens=16)
    store = TieredStore(MemoryTier(16 << 20))
    PrefixCachedModel(other, store, ns).prefill(torch.arange(40))
    with pytest.raises(ConfigError, match="geometry"):
        PrefixCachedModel(model, store, ns).prefill(torch.arange(40))
