"""KV layouts: which vLLM cache groups the connector serves exactly, and the one line for the rest."""

from __future__ import annotations

import pytest

from agentinfra.engines._kv_layout import KVGroup, KVLayout

LAYERS = tuple(f"model.layers.{i}.self_attn.attn" for i in range(4))


def full(**kw: object) -> KVGroup:
    return KVGroup("FullAttentionSpec", LAYERS, block_size=32, **kw)  # type: ignore[arg-type]


def test_plain_full_attention_is_served_with_the_label_of_before() -> None:
    layout = KVLayout.of([full()])
    assert layout.refusal() is None
    assert layout.label() == ""  # keys of a GQA engine stay what they were
    assert layout.layers == LAYERS
    assert layout.describe() == "1 group: FullAttentionSpec x4"


def test_sliding_window_stored_whole_is_served_and_labelled() -> None:
    layout = KVLayout.of([full(sliding_window=64)])
    assert layout.refusal() is None
    assert layout.label() == "full-sw64"
    assert "sliding window 64" in layout.describe()


def test_mla_is_served_unless_the_engine_says_its_context_path_is_inexact() -> None:
    layout = KVLayout.of([KVGroup("MLAAttentionSpec", LAYERS, block_size=16)])
    assert layout.refusal() is None
    assert layout.label() == "mla"
    line = layout.refusal(inexact_context="its MLA kernel has no cached-context path")
    assert line is not None
    assert "MLAAttentionSpec x4" in line
    assert "without the connector" in line
    assert "\n" not in line


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        ("MambaSpec", "Mamba or linear-attention state"),
        ("HiSparseHotSpec", "indexer"),
        ("ChunkedLocalAttentionSpec", "chunked local attention"),
        ("SomeFutureSpec", "SomeFutureSpec"),
    ],
)
def test_unserved_kinds_are_refused_in_one_line_naming_the_family(kind: str, named: str) -> None:
    layout = KVLayout.of([full(), KVGroup(kind, ("model.layers.4.mixer",), block_size=32)])
    line = layout.refusal()
    assert line is not None
    assert named in line
    assert "\n" not in line
    assert kind in line  # the groups, as vLLM names them


def test_two_groups_of_served_kinds_are_refused_naming_the_switch() -> None:
    sliding = KVGroup(
        "FullAttentionSpec", ("model.layers.4.self_attn.attn",), 32, sliding_window=64
    )
    line = KVLayout.of([full(), sliding]).refusal()
    assert line is not None
    assert "--disable-hybrid-kv-cache-manager" in line
    assert "2 groups" in line


def test_scaled_quantised_kv_and_untransferable_groups_are_refused() -> None:
    for mode in ("FP8_PER_TOKEN_HEAD", "INT8_PER_TOKEN_HEAD", "NVFP4", "TURBOQUANT_K8V4"):
        line = KVLayout.of([full(quant=mode)]).refusal() or ""
        assert "quantised" in line
        assert mode in line
        assert "--kv-cache-dtype" in line
    assert "not transferable" in (KVLayout.of([full(transfer=False)]).refusal() or "")
    assert "not transferable" in (KVLayout.of([full(eagle=True)]).refusal() or "")
    assert "no KV cache groups" in (KVLayout.of([]).refusal() or "")


def test_fp8_with_one_scale_per_layer_is_served() -> None:
    """Its scale is the layer's, from the checkpoint: the block's bytes are the whole state."""
    assert KVLayout.of([full(quant="FP8_PER_TENSOR")]).refusal() is None


def test_labels_differ_wherever_blocks_differ() -> None:
    labels = {
        KVLayout.of([full()]).label(),
        KVLayout.of([full(sliding_window=64)]).label(),
        KVLayout.of([full(sliding_window=128)]).label(),
        KVLayout.of([KVGroup("MLAAttentionSpec", LAYERS, 16)]).label(),
    }
    assert len(labels) == 4
