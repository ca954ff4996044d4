"""Pulumi.yaml is valid for the Pulumi CLI and declares exactly the config contract
the program reads; dependencies and node software versions are pinned."""

import json
import re
from pathlib import Path

import jsonschema
import yaml

from components import versions
from components.config_keys import CONFIG_KEYS

ROOT = Path(__file__).resolve().parent.parent
# A copy of Pulumi's official project-file schema, kept in the repository so this
# test needs nothing outside it.
SCHEMA = json.loads((ROOT / "tests" / "schemas" / "pulumi-project.schema.json").read_text())
PROJECT = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())


def test_project_file_matches_pulumis_schema():
    jsonschema.validate(PROJECT, SCHEMA)


def test_schema_check_would_catch_a_broken_file():
    broken = {**PROJECT, "config": {**PROJECT["config"], "vllmExtraArgs": {"type": "array"}}}  # array without items
    try:
        jsonschema.validate(broken, SCHEMA)
    except jsonschema.ValidationError:
        return
    raise AssertionError("the schema accepted an array config without items")


def test_project_is_python_with_a_managed_virtualenv_and_stacks_folder():
    assert PROJECT["name"] == "vllm-cluster"
    assert PROJECT["runtime"]["name"] == "python"
    assert PROJECT["runtime"]["options"]["toolchain"] == "pip"
    assert PROJECT["runtime"]["options"]["virtualenv"] == "venv"
    assert PROJECT["stackConfigDir"] == "stacks"
    assert (ROOT / "stacks").is_dir()


def test_every_config_key_is_declared_as_the_program_reads_it():
    declared = PROJECT["config"]
    assert list(declared) == [key.name for key in CONFIG_KEYS]
    for key in CONFIG_KEYS:
        entry = declared[key.name]
        assert entry["type"] == key.type, key.name
        assert entry["description"] == key.description, key.name
        if key.type == "array":
            assert entry["items"] == {"type": "string"}
        if key.required:
            assert "default" not in entry, f"{key.name} is required, so it has no default"
        else:
            assert entry["default"] == key.default, key.name


def test_no_secret_key_carries_a_default():
    """The CLI refuses a plaintext default on a `secret: true` key."""
    for name, entry in PROJECT["config"].items():
        assert not (entry.get("secret") and "default" in entry), name


def test_required_keys_are_the_contracts_required_ones():
    required = {name for name, entry in PROJECT["config"].items() if "default" not in entry}
    assert required == {"model", "apiAllowedCidrs", "adminCidrs"}


def _pins(path):
    pins = {}
    for line in (ROOT / path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-r"):
            name, _, version = line.partition("==")
            assert version, f"{path}: {line} is not pinned exactly"
            pins[name.lower()] = version
    return pins


def test_dependencies_are_pinned_exactly():
    runtime = _pins("requirements.txt")
    assert {"pulumi", "pulumi-aws", "pulumi-command", "pulumi-tls", "pulumi-random"} <= set(runtime)
    assert {"pytest", "jsonschema"} <= set(_pins("requirements-dev.txt"))


def test_node_software_versions_are_pinned_in_one_place():
    assert (versions.RAY_VERSION, versions.VLLM_VERSION) == ("2.60.0", "0.33.0")
    pattern = re.compile(re.escape(versions.RAY_VERSION) + "|" + re.escape(versions.VLLM_VERSION))
    for path in (
        list(ROOT.glob("components/*.py"))
        + [ROOT / "__main__.py", ROOT / "Pulumi.yaml"]
        + list(ROOT.glob("stacks/*"))
        + list(ROOT.glob("scripts/**/*"))
    ):
        # Python's byte-code caches (scripts/lib is imported by components/node_env.py) are no source.
        if path.is_file() and path.name != "versions.py" and "__pycache__" not in path.parts:
            assert not pattern.search(path.read_text()), f"{path} repeats a pinned version"
