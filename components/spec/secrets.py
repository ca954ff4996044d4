"""Secrets: the Hugging Face token and the API keys (hfToken, apiKey, previousApiKey).

A `Secret` (these, and the TLS and SSH private keys) never prints its value. Every secret
key must have been set with --secret; the token and the API keys are written to an env
file on the nodes, so they may hold only letters, digits and . _ ~ + / = -.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.config_keys import NAMESPACE
from components.spec.reader import Reader

MIN_API_KEY_LENGTH = 32
# The gateway holds the keys in an nginx map whose bucket must fit "Bearer KEY"
# (gateway_nginx.API_KEYS_MAP_BUCKET_SIZE).
MAX_API_KEY_LENGTH = 200
_TOKEN_CHARS = re.compile(r"^[A-Za-z0-9._~+/=-]+$")


class Secret:
    """A config value that must never be printed: repr and str hide it."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret(<{len(self._value)} characters>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class Secrets:
    hf_token: Secret | None
    api_key: Secret | None
    previous_api_key: Secret | None


def _check_secret_token(reader: Reader, key: str, min_length: int = 1) -> Secret | None:
    value = reader.string(key)
    if value is None:
        return None
    if key != "hfToken" and len(value) > MAX_API_KEY_LENGTH:
        reader.fail(key, f"is longer than {MAX_API_KEY_LENGTH} characters, more than the gateway's key map holds")
        return None
    if len(value) < min_length:
        reader.fail(
            key,
            f"is shorter than {min_length} characters. Fix: leave it unset to have one generated, "
            f'or pulumi config set --secret {NAMESPACE}:{key} "$(openssl rand -hex 24)"',
        )
        return None
    if not _TOKEN_CHARS.match(value):
        reader.fail(
            key,
            "may only hold letters, digits and . _ ~ + / = - (it is written to an env file on the nodes). "
            f"Fix: pulumi config set --secret {NAMESPACE}:{key} NEW_VALUE",
        )
        return None
    return Secret(value)


def check_secrets(reader: Reader, secret_keys: set[str] | None) -> Secrets:
    """Secrets must have been set with --secret: a plain value sits unencrypted in the
    stack file and in state. `secret_keys` None skips that check (no stack at hand)."""
    for key in ("hfToken", "apiKey", "previousApiKey", "tlsPrivateKey"):
        if reader.present(key) and secret_keys is not None and key not in secret_keys:
            reader.fail(
                key,
                "was set in plain text: it would sit unencrypted in the stack file and in state. "
                f"Fix: pulumi config set --secret {NAMESPACE}:{key} VALUE",
            )
    return Secrets(
        hf_token=_check_secret_token(reader, "hfToken"),
        api_key=_check_secret_token(reader, "apiKey", MIN_API_KEY_LENGTH),
        previous_api_key=_check_previous_api_key(reader),
    )


def _check_previous_api_key(reader: Reader) -> Secret | None:
    """The old key of a rotation: it needs the new one in apiKey beside it (a generated
    apiKey would lock every client out at once) and must differ from it."""
    previous = _check_secret_token(reader, "previousApiKey", MIN_API_KEY_LENGTH)
    if previous is None:
        return None
    if not reader.present("apiKey"):
        reader.fail(
            "previousApiKey",
            "is set but apiKey is not: a rotation keeps the old key here and the new one in apiKey. Fix: "
            f'pulumi config set --secret {NAMESPACE}:apiKey "$(openssl rand -hex 24)", or pulumi config rm '
            f"{NAMESPACE}:previousApiKey",
        )
    elif reader.raw.get("apiKey") == previous.reveal():
        reader.fail(
            "previousApiKey",
            f"is the same as apiKey: set apiKey to the new key. Fix: pulumi config set --secret {NAMESPACE}:apiKey "
            '"$(openssl rand -hex 24)"',
        )
    return previous
