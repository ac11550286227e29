"""The vLLM connector's planning, without vLLM: keys, loads, saves, waits, session hints and counts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agentinfra.engines._connector_plan import (
    BlockTransfer,
    ConnectorCounters,
    ConnectorSettings,
    FinishPlan,
    LookupWindow,
    RequestPlan,
    SaveTracker,
    SessionAction,
    SessionHint,
    begin_lookup,
    block_dimension,
    extend_keys,
    finish_request,
    forget_lookup,
    is_loadable,
    kv_dtype,
    lookup_window,
    matched_tokens,
    native_block_shape,
    native_layout_label,
    plan_load,
    plan_saves,
    request_namespace,
    session_hint,
    settle_lookup,
    take_load,
    take_new_block_ids,
    waits_for_saves,
    weights_identity,
)
from agentinfra.errors import ConfigError
from agentinfra.kvcache import (
    LAYOUT_ENGINE_NATIVE,
    BlockKey,
    Namespace,
    block_keys,
    encode_block,
    parse_block,
)

BLOCK = 4
NS = Namespace(
    model_id="tiny", kv_dtype="float32", kv_layout="vllm-cpu:test", block_size_tokens=BLOCK
)
TOKENS = list(range(100, 118))  # 18 tokens: 4 full blocks and 2 tokens over
KEYS = block_keys(NS, TOKENS)


def _plan(**fields: object) -> RequestPlan:
    return RequestPlan(NS, **fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- settings and namespace
def test_settings_from_extra_read_url_token_file_and_fields(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("# the kv server's token\nsecret-1\n")
    settings = ConnectorSettings.from_extra(
        {"url": "tcp://10.0.0.7:7999", "token_file": str(token), "tenant": "team-a", "save": False}
    )
    assert settings == ConnectorSettings(
        host="10.0.0.7", port=7999, token="secret-1", tenant="team-a", save=False
    )
    assert ConnectorSettings.from_extra({}) == ConnectorSettings()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"ulr": "x"},
            "unknown kv_connector_extra_config key(s) ['ulr']; known: ['announce', 'host', 'load', "
            "'load_chunk_mib', 'load_depth', 'lookup_timeout_s', 'max_pending_mib', 'model_id', 'port', 'save', 'shm_socket', "
            "'tenant', 'timeout_s', 'token', 'token_file', 'tool_wait_ttl_s', 'url', 'weights_revision']",
        ),
        (
            {"load_depth": 0},
            "kv_connector_extra_config load_chunk_mib=32.0 must be positive and load_depth=0 at least 1",
        ),
        (
            {"shm_socket": "/tmp/" + "k" * 110},
            f"kv_connector_extra_config shm_socket='/tmp/{'k' * 110}' must be a Unix socket path "
            "of at most 107 bytes",
        ),
        (
            {"url": "127.0.0.1"},
            "kv_connector_extra_config url '127.0.0.1' must be HOST:PORT, e.g. 127.0.0.1:7480",
        ),
        (
            {"url": ":7480"},
            "kv_connector_extra_config url ':7480' must be HOST:PORT, e.g. 127.0.0.1:7480",
        ),
    ],
)
def test_settings_refuse_bad_extra_config(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ConnectorSettings.from_extra(extra)
    assert str(caught.value) == message


def test_settings_refuse_a_missing_or_empty_token_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(ConfigError) as caught:
        ConnectorSettings.from_extra({"token_file": str(missing)})
    assert str(caught.value) == (
        f"cannot read token_file {missing}: No such file or directory (kv_connector_extra_config)"
    )
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    with pytest.raises(ConfigError) as caught:
        ConnectorSettings.from_extra({"token_file": str(empty)})
    assert str(caught.value) == f"token_file {empty} is empty (kv_connector_extra_config)"


def test_weights_identity_hashes_config_and_weight_names_and_sizes(tmp_path: Path) -> None:
    assert weights_identity("HuggingFaceTB/SmolLM2-135M-Instruct") == ""
    (tmp_path / "config.json").write_text('{"layers": 4}')
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 10)
    (tmp_path / "README.md").write_text("ignored")
    first = weights_identity(str(tmp_path))
    assert first.startswith("files-sha256:")
    assert len(first) == len("files-sha256:") + 32
    (tmp_path / "README.md").write_text("still ignored")
    assert weights_identity(str(tmp_path)) == first
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 11)
    assert weights_identity(str(tmp_path)) != first


def test_layout_label_and_kv_dtype() -> None:
    label = native_layout_label(device="cpu", isa="vec16", block_size=32, kv_heads=2, head_size=64)
    assert label == "vllm-cpu:native-block:isa=vec16:bs=32:h=2:d=64"
    assert kv_dtype("auto", "torch.float32") == "float32"
    assert kv_dtype("fp8_e4m3", "torch.bfloat16") == "fp8_e4m3"


def test_cache_salt_becomes_the_tenant_salt() -> None:
    assert request_namespace(NS, None) is NS
    assert request_namespace(NS, "") is NS
    salted = request_namespace(NS, "team-a")
    assert salted.tenant_salt == b"team-a"
    assert (salted.model_id, salted.kv_layout, salted.block_size_tokens) == (
        "tiny",
        "vllm-cpu:test",
        BLOCK,
    )
    assert block_keys(salted, TOKENS)[0] != KEYS[0]


@pytest.mark.parametrize(
    ("params", "hint"),
    [
        (None, None),
        ({}, None),
        ({"agentinfra": "run-1"}, None),
        ({"agentinfra": {"session": ""}}, None),
        ({"agentinfra": {"session": 7}}, None),
        ({"agentinfra": {"session": "run-1"}}, SessionHint("run-1", None, False)),
        (
            {"agentinfra": {"session": "run-2", "parent": "run-1", "state": "done"}},
            SessionHint("run-2", "run-1", True),
        ),
        ({"agentinfra": {"session": "run-2", "parent": 3}}, SessionHint("run-2", None, False)),
        (
            {"agentinfra": {"session": "s" * 300, "parent": "p" * 300}},
            SessionHint("s" * 200, "p" * 200, False),
        ),
    ],
)
def test_session_hint(params: object, hint: SessionHint | None) -> None:
    assert session_hint(params) == hint


# ---------------------------------------------------------------------- keys and lookups
def test_extend_keys_grows_one_chain_as_tokens_arrive() -> None:
    plan = _plan()
    assert extend_keys(plan, TOKENS[:9], 2) == KEYS[:2]
    assert extend_keys(plan, TOKENS, 1) == KEYS[:1]  # a prefix of the chain, nothing recomputed
    assert plan.keys == KEYS[:2]
    assert extend_keys(plan, TOKENS, 4) == KEYS
    assert plan.keys == KEYS


@pytest.mark.parametrize(
    ("prompt", "computed", "window"),
    [
        (0, 0, None),
        (4, 0, None),  # one block, but its last token must be computed
        (5, 0, LookupWindow(1, 0)),
        (18, 0, LookupWindow(4, 0)),
        (17, 0, LookupWindow(4, 0)),
        (16, 0, LookupWindow(3, 0)),
        (18, 8, LookupWindow(4, 2)),
        (18, 16, None),  # vLLM already has every usable block
    ],
)
def test_lookup_window(prompt: int, computed: int, window: LookupWindow | None) -> None:
    assert lookup_window(prompt, computed, BLOCK) == window


@pytest.mark.parametrize(
    ("hits", "window", "tokens"),
    [(0, LookupWindow(4, 0), 0), (3, LookupWindow(4, 0), 12), (9, LookupWindow(4, 0), 16),
     (3, LookupWindow(4, 2), 4), (2, LookupWindow(4, 2), 0), (1, LookupWindow(4, 2), 0)],
)  # fmt: skip
def test_matched_tokens(hits: int, window: LookupWindow, tokens: int) -> None:
    assert matched_tokens(hits, window, BLOCK) == tokens


def test_a_lookup_answers_counts_its_hits() -> None:
    plan, counters = _plan(), ConnectorCounters()
    begin_lookup(plan, now_s=10.0, counters=counters)
    assert plan.lookup_started_s == 10.0
    early = settle_lookup(
        plan, None, is_answered=False, now_s=11.9, timeout_s=2.0, counters=counters
    )
    assert early is None
    assert plan.hits is None
    assert (
        settle_lookup(plan, 3, is_answered=True, now_s=12.0, timeout_s=2.0, counters=counters) == 3
    )
    assert plan.hits == 3
    assert counters.as_dict() == {**ConnectorCounters().as_dict(), "lookups": 1, "hit_blocks": 3}


def test_a_lookup_that_times_out_or_fails_is_a_miss() -> None:
    plan, counters = _plan(), ConnectorCounters()
    begin_lookup(plan, now_s=10.0, counters=counters)
    assert (
        settle_lookup(plan, None, is_answered=False, now_s=12.0, timeout_s=2.0, counters=counters)
        == 0
    )
    assert (plan.hits, counters.lookup_timeouts, counters.hit_blocks) == (0, 1, 0)
    failed, counters = _plan(), ConnectorCounters()
    begin_lookup(failed, now_s=0.0, counters=counters)
    assert (
        settle_lookup(failed, None, is_answered=True, now_s=0.1, timeout_s=2.0, counters=counters)
        == 0
    )
    assert (failed.hits, counters.lookups, counters.lookup_timeouts) == (0, 1, 0)


def test_a_lookup_waits_for_a_finished_requests_saves_of_its_blocks() -> None:
    plan, counters = _plan(), ConnectorCounters()
    keys = KEYS[:3]
    other = {"req-0": {b"not one of ours"}}

    def wait(in_flight: dict[str, set[bytes]], now_s: float) -> bool:
        return waits_for_saves(plan, keys, in_flight, now_s=now_s, timeout_s=2.0, counters=counters)

    assert wait({}, 5.0) is False
    assert wait(other, 5.0) is False
    assert counters.save_waits == 0
    sending = {**other, "req-1": {bytes(KEYS[1])}}
    assert wait(sending, 5.0) is True
    assert wait(sending, 6.9) is True
    assert wait(sending, 7.0) is False
    assert (plan.save_wait_started, counters.save_waits) == (5.0, 1)  # counted once per request


# ---------------------------------------------------------------------- loads and saves
def test_a_load_after_alloc_covers_the_external_blocks_and_saves_start_after_them() -> None:
    plan = _plan(local_computed=4)  # vLLM's own prefix cache had block 0
    plan_load(plan, TOKENS, [70, 71, 72, 73, 74], external_tokens=8)
    assert plan.pending_load == BlockTransfer(KEYS[1:3], [71, 72])
    assert plan.next_save == 3
    assert take_load(plan) == BlockTransfer(KEYS[1:3], [71, 72])
    assert take_load(plan) is None


def test_without_external_tokens_saves_start_after_the_local_blocks() -> None:
    plan = _plan(local_computed=8, next_save=1)
    plan_load(plan, TOKENS, [], external_tokens=0)
    assert (plan.pending_load, plan.next_save, plan.keys) == (None, 2, [])


def test_saves_follow_what_each_step_computed_full_blocks_once() -> None:
    plan = _plan()
    plan.block_ids = [10, 11]
    assert plan_saves(plan, TOKENS, computed_tokens=3) is None  # no full block yet
    assert plan_saves(plan, TOKENS, computed_tokens=8) == BlockTransfer(KEYS[:2], [10, 11])
    assert plan_saves(plan, TOKENS, computed_tokens=12) is None  # no block id for block 2 yet
    take_new_block_ids(plan, [12, 13, 14], is_resumed=False)
    assert plan_saves(plan, TOKENS, computed_tokens=13) == BlockTransfer(KEYS[2:3], [12])
    assert plan_saves(plan, TOKENS[:15], computed_tokens=40) is None  # only 15 tokens so far
    assert plan_saves(plan, TOKENS, computed_tokens=40) == BlockTransfer(KEYS[3:4], [13])
    assert plan.next_save == 4
    assert plan.saved == {bytes(key) for key in KEYS}


def test_saves_skip_loaded_blocks() -> None:
    plan = _plan(local_computed=0)
    plan_load(plan, TOKENS, [20, 21, 22, 23], external_tokens=8)
    plan.block_ids = [20, 21, 22, 23]
    assert plan_saves(plan, TOKENS, computed_tokens=16) == BlockTransfer(KEYS[2:4], [22, 23])
    assert plan.saved == {bytes(KEYS[2]), bytes(KEYS[3])}


def test_block_ids_append_or_are_replaced_after_preemption() -> None:
    plan = _plan(block_ids=[1, 2])
    take_new_block_ids(plan, None, is_resumed=False)
    take_new_block_ids(plan, [], is_resumed=False)
    assert plan.block_ids == [1, 2]
    take_new_block_ids(plan, [3], is_resumed=False)
    assert plan.block_ids == [1, 2, 3]
    take_new_block_ids(plan, [7, 8], is_resumed=True)
    assert plan.block_ids == [7, 8]
    take_new_block_ids(plan, None, is_resumed=True)
    assert plan.block_ids == []


def test_a_preempted_request_asks_again() -> None:
    plan = _plan(hits=3, pending_load=BlockTransfer(KEYS[:1], [5]), next_save=3)
    forget_lookup(plan)
    assert (plan.hits, plan.pending_load, plan.next_save) == (None, None, 3)


@pytest.mark.parametrize(
    ("hint", "saved", "finish"),
    [
        (None, set(), FinishPlan(None, None)),
        (None, {b"k"}, FinishPlan(None, {b"k"})),
        (SessionHint("run-1", None, False), set(), FinishPlan(SessionAction("run-1", "end", 120.0), None)),
        (SessionHint("run-1", "run-0", True), {b"k"}, FinishPlan(SessionAction("run-1", "close"), {b"k"})),
    ],
)  # fmt: skip
def test_finish_request(hint: SessionHint | None, saved: set[bytes], finish: FinishPlan) -> None:
    plan = _plan(hint=hint, saved=saved)
    assert finish_request(plan, tool_wait_ttl_s=120.0) == finish


def test_one_request_from_lookup_to_finish() -> None:
    """A 18-token prompt; the store has 3 blocks; chunked prefill of 8 tokens a step, then decode."""
    counters = ConnectorCounters()
    plan = RequestPlan(request_namespace(NS, None), hint=session_hint(None))
    window = lookup_window(len(TOKENS), 0, BLOCK)
    assert window == LookupWindow(4, 0)
    assert extend_keys(plan, TOKENS, window.usable_blocks) == KEYS
    begin_lookup(plan, now_s=0.0, counters=counters)
    hits = settle_lookup(plan, 3, is_answered=True, now_s=0.1, timeout_s=2.0, counters=counters)
    assert hits == 3
    external = matched_tokens(hits, window, BLOCK)
    assert external == 12
    plan_load(plan, TOKENS, [40, 41, 42, 43, 44], external_tokens=external)
    plan.block_ids = [40, 41, 42, 43, 44]
    assert take_load(plan) == BlockTransfer(KEYS[:3], [40, 41, 42])
    assert plan_saves(plan, TOKENS, computed_tokens=12 + 6) == BlockTransfer(KEYS[3:4], [43])
    grown = [*TOKENS, 900, 901]  # two output tokens complete block 4
    assert plan_saves(plan, grown, computed_tokens=20) == BlockTransfer(
        block_keys(NS, grown)[4:5], [44]
    )
    finish = finish_request(plan, tool_wait_ttl_s=1.0)
    assert finish.hint is None
    assert finish.held_keys == {bytes(KEYS[3]), bytes(block_keys(NS, grown)[4])}
    assert counters.as_dict() == {**ConnectorCounters().as_dict(), "lookups": 1, "hit_blocks": 3}


# ---------------------------------------------------------------------- the worker's side
def test_block_dimension() -> None:
    shape = (30, 2, 32, 128)
    assert block_dimension([shape, shape], ["float32", "float32"], 30) == 0
    assert block_dimension([(2, 30, 32, 128)] * 2, ["float32"] * 2, 30) == 1
    assert block_dimension([(2, 30, 30)], ["float32"], 30) == 1  # the first that fits
    assert block_dimension([shape], ["float32"], 0) == 0  # unknown: dimension 0
    assert block_dimension([shape], ["float32"], 31) is None
    assert block_dimension([shape, (30, 2, 32, 64)], ["float32"] * 2, 30) is None
    assert block_dimension([shape, shape], ["float32", "bfloat16"], 30) is None


def test_native_block_shape() -> None:
    exact = {"layers": 4, "block_size": 32, "kv_heads": 2, "head_size": 64}
    assert native_block_shape(**exact, block_elements=2 * 32 * 2 * 64) == (4, 2, 32, 2, 64)
    padded = native_block_shape(**exact, block_elements=2 * 32 * 2 * 80)
    assert padded == (4, 2, 32, 1, 160)


def test_is_loadable_wants_native_layout_size_and_dtype() -> None:
    key = BlockKey(b"\1" * 32)
    kv = np.zeros((2, 2, 4, 1, 8), dtype=np.float32)
    native = parse_block(encode_block(key, kv, layout=LAYOUT_ENGINE_NATIVE))
    canonical = parse_block(encode_block(key, kv))
    assert native is not None
    assert canonical is not None
    size = kv.nbytes
    assert is_loadable(native.header, payload_bytes=size, dtype="float32") is True
    assert is_loadable(canonical.header, payload_bytes=size, dtype="float32") is False
    assert is_loadable(native.header, payload_bytes=size + 4, dtype="float32") is False
    assert is_loadable(native.header, payload_bytes=size, dtype="bfloat16") is False


def test_save_tracker_confirms_a_request_once_its_puts_are_answered() -> None:
    saves = SaveTracker(limit_bytes=100)
    saves.expect({"a", "b"})
    assert saves.admit({"a", "b"}, 60) is True
    assert saves.admit({"a"}, 41) is False  # past the backlog: dropped
    assert saves.admit({"a"}, 40) is True
    assert saves.pending_bytes == 100
    assert saves.finished({"a", "never-saved"}) == set()  # a's PUTs are still out
    saves.answered({"a", "b"}, 60)
    assert saves.finished(set()) == set()
    saves.answered({"a"}, 40)  # a's last PUT: a is reported at the next call
    assert saves.pending_bytes == 0
    assert saves.finished({"b"}) == {"a", "b"}
    assert saves.finished({"a", "b"}) == set()  # each once


def test_save_tracker_reports_a_request_without_puts_left_at_once() -> None:
    saves = SaveTracker(limit_bytes=10)
    saves.expect({"c"})
    assert saves.admit({"c"}, 11) is False
    assert saves.finished({"c"}) == {"c"}


def test_the_planning_imports_neither_torch_nor_vllm() -> None:
    code = (
        "import sys, agentinfra.engines._connector_plan, agentinfra.engines._connector_remote, "
        "agentinfra.engines; print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "[]"
