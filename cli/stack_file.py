"""Reading a stack file (stacks/Pulumi.<stack>.yaml, or one the operator names) into
the validated spec, as `pulumi up` would hand its config to the program: Pulumi.yaml's
required keys, types and defaults first, then components/spec/'s validation.

Pure: YAML and the spec, no Pulumi SDK. `status` and `preflight` only need the spec,
so they start without loading the engine; `plan` and the tests get their config from
here too before they run the program under the mock runtime (cli/mock_runtime.py).

Every way a stack file can be unusable (missing, unreadable, not YAML, refused by
Pulumi.yaml or by the spec) is a StackFileError whose message is one line that
names the file, for the operator commands to print as it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from components.config_keys import CONFIG_KEYS, NAMESPACE
from components.spec import ClusterSpec, SpecError, load_spec

ROOT = Path(__file__).resolve().parent.parent
STACKS_DIR = ROOT / "stacks"
PROJECT_FILE = ROOT / "Pulumi.yaml"
PROJECT = NAMESPACE

# Secret values in a stack file are ciphertext (`secure:`) that cannot be read
# offline; they change nothing the operator tools look at, so stand-ins that pass
# validation are used.
SECRET_STAND_INS = {
    "apiKey": "planner-stand-in-for-the-api-key-0000",
    "hfToken": "hf_planner_stand_in",
    "tlsPrivateKey": "-----BEGIN PRIVATE KEY-----\nUExBTk5FUg==\n-----END PRIVATE KEY-----\n",
    "sshPrivateKey": "-----BEGIN OPENSSH PRIVATE KEY-----\nUExBTk5FUg==\n-----END OPENSSH PRIVATE KEY-----\n",
}
_SECRET_KEYS = {key.name for key in CONFIG_KEYS if key.secret}
# libyaml's safe loader where PyYAML was built with it: the same documents, read in a
# fraction of the pure-Python loader's time (most of what `status` spends on the file).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StackFileError(Exception):
    """A stack file the tools cannot use; the message is one line naming the file."""


class ProjectConfigError(Exception):
    """What the Pulumi CLI says before it starts the program when the stack's config
    does not satisfy Pulumi.yaml's declarations."""


@dataclass(frozen=True)
class Stack:
    name: str
    path: Path
    config: dict[str, Any]  # vllm-cluster keys without the namespace, secrets stood in for
    secret_keys: list[str]  # the keys whose values were stood in for
    spec: ClusterSpec


def stack_names() -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in STACKS_DIR.glob("Pulumi.*.yaml"))


def ec2_stack_names() -> list[str]:
    """The stacks that create their EC2 instances (no hosts listed): the AWS resources'
    own tests run on these; a stack of hosts the user has creates none."""
    return [name for name in stack_names() if not read_config(stack_path(name)).get(f"{NAMESPACE}:hosts")]


def stack_path(stack: str, stack_file: str | Path | None = None) -> Path:
    return Path(stack_file) if stack_file else STACKS_DIR / f"Pulumi.{stack}.yaml"


def shown(path: Path) -> str:
    """The path as the operator would type it from the repository root."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's several-line message as one line: what is wrong, and where."""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


def read_config(path: Path) -> dict[str, Any]:
    """The file's `config:` map, as the YAML holds it (namespaced keys)."""
    try:
        document = yaml.load(path.read_text(), Loader=_SAFE_LOADER)
    except FileNotFoundError:
        known = f" (stacks here: {', '.join(stack_names())})" if path.parent == STACKS_DIR else ""
        raise StackFileError(f"{shown(path)}: no such stack file{known}") from None
    except OSError as error:
        raise StackFileError(f"{shown(path)}: cannot read it: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise StackFileError(f"{shown(path)}: cannot read it: not UTF-8 text ({error.reason})") from error
    except yaml.YAMLError as error:
        raise StackFileError(f"{shown(path)}: not valid YAML: {_yaml_problem(error)}") from error
    if document is None:
        return {}  # an empty file: Pulumi.yaml's check then names the required keys
    config = document.get("config") if isinstance(document, dict) else None
    if not isinstance(document, dict) or not isinstance(config, (dict, type(None))):
        raise StackFileError(
            f"{shown(path)}: not a stack file: expected a `config:` map of {NAMESPACE}:<key>: <value> lines"
        )
    return dict(config or {})


def stack_config(stack: str) -> dict[str, Any]:
    """The `config:` map of stacks/Pulumi.<stack>.yaml, as the YAML holds it."""
    return read_config(stack_path(stack))


def _fits_declared_type(declared: dict, value: Any) -> bool:
    kind = declared["type"]
    if isinstance(value, dict) and set(value) == {"secure"}:
        return True  # an encrypted value: the CLI decrypts it to the declared type
    if kind == "array":
        return isinstance(value, list) and all(_fits_declared_type(declared["items"], item) for item in value)
    if isinstance(value, (list, dict)):
        return False
    if kind == "integer":
        return not isinstance(value, bool) and (isinstance(value, int) or str(value).lstrip("-").isdigit())
    if kind == "boolean":
        return isinstance(value, bool) or str(value) in ("true", "false")
    return True  # a string: any scalar, as the CLI stores scalars as text


def _mistyped(key: str, declared: dict, value: Any) -> str:
    # A secret's value is never shown, even a plaintext one in the wrong place.
    what = "its value" if key in _SECRET_KEYS else json.dumps(value)
    kind = f"array of {declared['items']['type']}" if declared["type"] == "array" else declared["type"]
    return f"{key} ({what}; Pulumi.yaml declares {kind})"


def apply_project_config(stack: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """Do what the Pulumi CLI does with Pulumi.yaml's `config:` block before it runs
    the program: every declared key without a default must be set, set values must
    fit the declared type, and defaults fill in the keys the stack leaves out."""
    project = yaml.load(PROJECT_FILE.read_text(), Loader=_SAFE_LOADER)
    merged = dict(config)
    missing, mistyped = [], []
    for key, declared in (project.get("config") or {}).items():
        full_key = f"{PROJECT}:{key}"
        if full_key in merged:
            if not _fits_declared_type(declared, merged[full_key]):
                mistyped.append(_mistyped(key, declared, merged[full_key]))
        elif "default" in declared:
            merged[full_key] = declared["default"]
        else:
            missing.append(key)
    if missing:
        raise ProjectConfigError(f"Stack '{stack}' is missing configuration value(s) {', '.join(missing)}")
    if mistyped:
        raise ProjectConfigError(f"Stack '{stack}' has configuration of the wrong type: {', '.join(mistyped)}")
    return merged


def readable_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The stack's vllm-cluster keys (namespace stripped), secrets replaced by stand-ins."""
    values, secret = {}, []
    for key, value in config.items():
        if not key.startswith(f"{NAMESPACE}:"):
            continue
        name = key.split(":", 1)[1]
        if isinstance(value, dict) and "secure" in value:
            values[name] = SECRET_STAND_INS.get(name, value)
            secret.append(name)
        else:
            values[name] = value
    return values, secret


def spec_problems(error: SpecError) -> str:
    """Every problem the spec found, on one line."""
    problems = [str(problem) for problem in error.problems]
    return problems[0] if len(problems) == 1 else f"{len(problems)} problems: " + "; ".join(problems)


def read_stack(stack: str, stack_file: str | Path | None = None) -> Stack:
    """The stack's config and validated spec, from stacks/Pulumi.<stack>.yaml or
    `stack_file`, with Pulumi.yaml's defaults applied. Raises StackFileError."""
    path = stack_path(stack, stack_file)
    try:
        raw = read_config(path)
        config, secret_keys = readable_config(apply_project_config(stack, raw))
        # The region the stack deploys to: the spec checks the zone against it.
        spec = load_spec(config, stack=stack, region=raw.get("aws:region"), secret_keys=set(secret_keys))
    except ProjectConfigError as error:
        raise StackFileError(f"{shown(path)}: {error}") from error
    except SpecError as error:
        raise StackFileError(f"{shown(path)}: {spec_problems(error)}") from error
    return Stack(name=stack, path=path, config=config, secret_keys=secret_keys, spec=spec)
