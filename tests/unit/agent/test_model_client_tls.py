"""Every `ModelClient` of a process shares one TLS context: building one read the CA bundle (~25 ms of CPU each)."""

from __future__ import annotations

from agentinfra.agent import ModelClient, profile_for


def _client() -> ModelClient:
    return ModelClient(base_url="https://example.invalid/v1", model="m", api_key="k",
                       api_key_env="K", profile=profile_for("m"))  # fmt: skip


def _tls_context(client: ModelClient) -> object:
    return client._clients[client.base_url]._client._transport._pool._ssl_context  # type: ignore[attr-defined]


def test_clients_share_one_tls_context_that_verifies() -> None:
    first, second = _client(), _client()
    context = _tls_context(first)
    assert context is _tls_context(second)
    assert context.verify_mode.name == "CERT_REQUIRED"  # type: ignore[attr-defined]
    assert context.check_hostname  # type: ignore[attr-defined]
