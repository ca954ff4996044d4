"""Reading a stack's raw config values, and saying what is wrong with them.

`Reader` parses each value (a string as Pulumi passes it, or a native YAML value) into
the type its key takes and records a `Problem` instead of raising, so that `load_spec`
reports every problem at once. A Problem shows the value as the user wrote it, never a
secret's (`show`).
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from components.config_keys import KEYS_BY_NAME, NAMESPACE, ConfigKey, closest_key, unknown_keys


@dataclass(frozen=True)
class Problem:
    key: str
    value: str  # already rendered for display; secrets are never shown
    message: str

    def __str__(self) -> str:
        return f"{NAMESPACE}:{self.key} = {self.value}: {self.message}"


class SpecError(Exception):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = [f"the stack's config has {len(problems)} problem(s); no resource was created:"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.problems]


# Characters that would let a value escape into a shell: ; $ ` ' " | & < > ( ) \ { } * ? ! # ~,
# whitespace and control characters. Model ids, names and vLLM words never need them.
_SHELL_META = set(";$`'\"|&<>()\\{}*?!#~") | {" ", "\t", "\n", "\r"}
# A DNS name: own hosts' gatewayHost and the certificate's endpointHostname.
HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}$")


# Values longer than this are cut in errors: a certificate pasted into the wrong key
# should not fill the terminal.
_MAX_SHOWN = 200


def _kind(raw: Any) -> str:
    """What a value is, in the words of a stack file."""
    if isinstance(raw, bool):
        return "true/false"
    if isinstance(raw, (int, float)):
        return "a number"
    if isinstance(raw, str):
        return "text"
    if isinstance(raw, (list, tuple)):
        return "a list"
    if isinstance(raw, dict):
        return "a map"
    if isinstance(raw, datetime.date):
        return "a date"  # YAML reads an unquoted 2024-01-01 as one
    return f"a {type(raw).__name__}"


def _display(raw: Any) -> str:
    """JSON where it can be (strings quoted, lists as lists); else the value's own text (a
    YAML date); else only its kind (a number too long for Python to print)."""
    for render in (json.dumps, str):
        try:
            text = render(raw)
        except (TypeError, ValueError):
            continue
        if len(text) <= _MAX_SHOWN:
            return text
        length = len(raw) if isinstance(raw, (str, list)) else len(text)
        return f"{text[:_MAX_SHOWN]}... ({length} {'items' if isinstance(raw, list) else 'characters'})"
    return f"<{_kind(raw)}>"


def show(key: str, raw: Any) -> str:
    """How a value appears in an error: quoted, and never the value of a secret. A key
    the program does not know may be a misspelt secret (hftoken), so its value is
    hidden too."""
    if raw is None:
        return "(not set)"
    if key not in KEYS_BY_NAME or KEYS_BY_NAME[key].secret:
        return f"<hidden, {len(raw)} characters>" if isinstance(raw, str) else f"<hidden, {_kind(raw)}>"
    return _display(raw)


def shell_meta_in(text: str) -> str:
    found = sorted({ch for ch in text if ch in _SHELL_META or not ch.isprintable()})
    return " ".join(repr(ch) for ch in found)


def injection_note(text: str) -> str:
    """The clause every refused name adds when it holds shell characters: the reason these
    values are checked at all is that they reach a shell on the nodes."""
    meta = shell_meta_in(text)
    return f"; it contains {meta}, which could inject into a shell on the nodes" if meta else ""


# Whole numbers as config values: digits only (no 1e3, no 1_000), and few enough of them
# that every later sum and message stays an ordinary int.
_WHOLE_NUMBER = re.compile(r"^-?[0-9]{1,15}$")
_MAX_WHOLE_NUMBER = 10**15


def _means_unset(value: Any, definition: ConfigKey | None) -> bool:
    """Absent, empty, or the key's auto default (which Pulumi fills in from Pulumi.yaml).
    Compares like with like, so that no value is turned into text just to be compared."""
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return True
    if definition is None or not definition.auto:
        return False
    if isinstance(value, str):
        return value.strip().lower() == str(definition.default).lower()
    return type(value) is type(definition.default) and value == definition.default


def _as_float(value: Any) -> float | None:
    """None for what is no number: true/false (which Python would read as 1 and 0), text
    that does not parse, an int beyond any float, a list."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except (ValueError, OverflowError):
        return None


class Reader:
    """Parses raw config values (strings as Pulumi passes them, or native YAML
    values) into typed values, recording a Problem instead of raising. A value of
    the wrong type is one problem that names the type the key takes and how to set it."""

    def __init__(self, raw: Mapping[str, Any]):
        self.raw = raw
        self.problems: list[Problem] = []
        self.warnings: list[str] = []  # worth saying, but no reason to stop a deployment

    def fail(self, key: str, message: str, raw: Any = ...) -> None:
        value = self.raw.get(key) if raw is ... else raw
        self.problems.append(Problem(key, show(key, value), message))

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def wrong_type(self, key: str, expected: str, placeholder: str) -> None:
        definition = KEYS_BY_NAME[key]
        if definition.type == "array":
            fix = f"pulumi config set --path '{NAMESPACE}:{key}[0]' {placeholder}"
        else:
            fix = f"pulumi config set {'--secret ' if definition.secret else ''}{NAMESPACE}:{key} {placeholder}"
        if not definition.required:
            fix += f", or pulumi config rm {NAMESPACE}:{key} for the default"
        value = self.raw.get(key)
        found = "" if isinstance(value, str) else f", not {_kind(value)}"
        self.fail(key, f"must be {expected}{found}. Fix: {fix}")

    def present(self, key: str) -> bool:
        """Set to something other than "not set": absent, empty, or the key's
        auto default (which Pulumi fills in from Pulumi.yaml) all mean unset."""
        return not _means_unset(self.raw.get(key), KEYS_BY_NAME.get(key))

    def default(self, key: str) -> Any:
        definition = KEYS_BY_NAME[key]
        return None if definition.auto else definition.default

    def string(self, key: str) -> str | None:
        if not self.present(key):
            if KEYS_BY_NAME[key].required:
                self.fail(key, f"is required. Fix: pulumi config set {NAMESPACE}:{key} VALUE")
            return self.default(key)
        value = self.raw[key]
        if not isinstance(value, str):
            self.wrong_type(key, "text (in a stack file, put it in quotes)", "TEXT")
            return None
        return value

    def integer(self, key: str) -> int | None:
        if not self.present(key):
            return self.default(key)
        value = self.raw[key]
        if isinstance(value, str) and _WHOLE_NUMBER.match(value.strip()):
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) < _MAX_WHOLE_NUMBER:
            return value
        default = KEYS_BY_NAME[key].default
        example = f", e.g. {default}" if isinstance(default, int) and default > 0 else ""
        self.wrong_type(key, f"a whole number{example}", "NUMBER")
        return None

    def number(self, key: str) -> float | None:
        """A decimal number. Pulumi.yaml has no number type, so the key is declared
        a string and YAML may hand us either a float or its text."""
        if not self.present(key):
            return self.default(key)
        parsed = _as_float(self.raw[key])
        if parsed is None:
            self.wrong_type(key, "a number such as 0.90", "0.90")
        return parsed

    def boolean(self, key: str) -> bool | None:
        if not self.present(key):
            return self.default(key)
        value = self.raw[key]
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if KEYS_BY_NAME[key].auto:
            self.wrong_type(key, "true or false (or auto)", "auto")
        else:
            self.wrong_type(key, "true or false", "true")
        return None

    def string_list(self, key: str) -> list[str] | None:
        example = "203.0.113.0/24" if "Cidr" in key else "--enforce-eager"
        if not self.present(key):
            if KEYS_BY_NAME[key].required:
                self.fail(
                    key,
                    "is required: a list of CIDRs. "
                    f"Fix: pulumi config set --path '{NAMESPACE}:{key}[0]' 203.0.113.0/24",
                )
                return None
            default = self.default(key)
            return list(default) if default is not None else None
        value = self.raw[key]
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):  # not JSON, or nested deeper than Python recurses
                value = None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            self.wrong_type(key, f'a list of strings, e.g. ["{example}"]', example)
            return None
        return value


def set_beyond_default(reader: Reader, key: str) -> bool:
    """Set to something other than its default. Pulumi passes every key's Pulumi.yaml
    default to the program, so a key left alone arrives with its default value."""
    if not reader.present(key):
        return False
    default = KEYS_BY_NAME[key].default
    return str(reader.raw[key]).strip().lower() != str(default).lower()


def check_known_keys(reader: Reader) -> None:
    for name in unknown_keys(reader.raw):
        guess = closest_key(name)
        reader.fail(
            name,
            "is not a setting of vllm-cluster"
            + (f"; did you mean {guess}?" if guess else "")
            + f" Fix: pulumi config rm {NAMESPACE}:{name}",
        )
