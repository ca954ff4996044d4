"""The README is the front door and docs/ holds the rest: the config reference, commands,
outputs, links and the tests they name must say what the code does."""

import json
import re
from pathlib import Path

import pytest
import yaml
from pulumi_mocks import stack_names

from components.config_keys import CONFIG_KEYS
from components.spec import SpecError, load_spec
from tools import render_config_reference

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
# The front door, the topic files and the top-level folders' READMEs: every page a reader
# follows a link to.
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted(ROOT.glob("*/README.md"))]
README_MAX_LINES = 260


def doc(name: str) -> str:
    return (DOCS / name).read_text()


def config_table() -> dict[str, tuple[str, str, str, str]]:
    rows = {}
    for line in doc("configuration-reference.md").splitlines():
        match = re.match(r"^\| `(\w+)` \| (\w+) \| (.+?) \| (.+) \| ([^|]+) \| ([^|]+) \|$", line)
        if match:
            key, type_, default, meaning, stacks, _ = match.groups()
            rows[key] = (type_, default, meaning, stacks)
    return rows


def test_config_reference_matches_the_contract():
    rows = config_table()
    assert list(rows) == [key.name for key in CONFIG_KEYS]
    for key in CONFIG_KEYS:
        type_, default, meaning, _ = rows[key.name]
        assert type_ == key.type, key.name
        assert default == ("required" if key.required else f"`{json.dumps(key.default)}`"), key.name
        assert meaning == key.description, key.name


def test_the_config_reference_is_what_the_keys_render():
    """docs/configuration-reference.md is generated: a key changed without `make config-reference`
    (or the file edited by hand) fails here."""
    assert doc("configuration-reference.md") == render_config_reference.render(), (
        "docs/configuration-reference.md differs from components/config_keys.py: run make config-reference"
    )


def _stack_config(stack: str) -> dict:
    config = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())["config"]
    return {name.split(":", 1)[1]: value for name, value in config.items() if name.startswith("vllm-cluster:")}


# A value for each key the reference says only one kind of stack may set: valid on its own, so
# a refusal on the other kind is the rule the reference states.
_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE=\n-----END OPENSSH PRIVATE KEY-----\n"
EXAMPLES = {
    "availabilityZone": "us-east-1a",
    "vpcCidr": "10.50.0.0/16",
    "vpcId": "vpc-0123456789abcdef0",
    "publicSubnetId": "subnet-0123456789abcdef0",
    "privateSubnetId": "subnet-0123456789abcdef1",
    "amiId": "ami-0123456789abcdef0",
    "nodeImage": "none",
    "capacityReservationId": "cr-0123456789abcdef0",
    "capacityBlock": True,
    "placementGroupName": "my-group",
    "rootVolumeGiB": 300,
    "retainModelCache": True,
    "modelCacheFileSystemId": "fs-0123456789abcdef0",
    "gatewayInstanceType": "t3.medium",
    "maxReplicas": 2,
    "idleStopMinutes": 30,
    "wakeGiveUpMinutes": 30,
    "stageVolume": "ebs",
    "gatewayHost": "203.0.113.10",
    "gatewayPrivateIp": "192.0.2.10",
    "hostKeys": ["203.0.113.10 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDtNZh+iepw+R/bZZsPOkGlXZwaezlOQ66cB4tCRkUM2"],
    "sshUser": "admin",
    "sshPrivateKey": _KEY,
    "modelCacheDir": "/srv/vllm-models",
    "gpusPerNode": 1,
    "gpuMemoryGiB": 24,
}


@pytest.mark.parametrize(
    "key, may_set, other_stack",
    [
        (name, stacks, "own-hosts" if stacks == render_config_reference.EC2 else "dev")
        for name, (_, _, _, stacks) in config_table().items()
        if stacks in (render_config_reference.EC2, render_config_reference.HOSTS)
    ],
)
def test_a_key_the_reference_gives_one_kind_of_stack_is_refused_on_the_other(key, may_set, other_stack):
    base = _stack_config(other_stack)
    if other_stack == "own-hosts":
        base["sshPrivateKey"] = _KEY  # the stack file's is a placeholder set with --secret
    load_spec(base, stack=other_stack, region="us-east-1")  # the stack alone is valid: the key is refused
    with pytest.raises(SpecError) as refused:
        load_spec({**base, key: EXAMPLES[key]}, stack=other_stack, region="us-east-1")
    assert key in {problem.key for problem in refused.value.problems}, f"{key} ({may_set} only) on {other_stack}"


def test_the_test_command_is_what_ci_runs():
    assert "```sh\nmake test\n```" in README
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^test:", (ROOT / "Makefile").read_text(), re.M)


def test_deploy_and_destroy_commands_exist():
    for command in ("scripts/deploy", "scripts/destroy"):
        assert f"{command} dev" in README
        assert (ROOT / command).stat().st_mode & 0o111


def test_every_stack_is_described():
    for stack in stack_names():
        assert f"| `{stack}` |" in README


def test_every_export_is_documented():
    main = (ROOT / "__main__.py").read_text()
    exports = re.findall(r'pulumi\.export\(\s*"(\w+)"', main)
    assert len(exports) >= 9
    for name in exports:
        assert f"`{name}`" in README, name


def test_the_operator_tools_are_documented_as_they_are_called():
    tool = ROOT / "scripts" / "vllm-cluster"
    operations = doc("operations.md")
    assert tool.stat().st_mode & 0o111
    for command in ("plan --stack prod", "preflight --stack prod", "status --stack prod"):
        assert f"scripts/vllm-cluster {command}" in operations, command
    for flag in ("--json", "--watch", "--params-b", "--dtype", "--outputs", "--stack-file"):
        assert flag in operations, flag


def test_the_readme_stays_a_front_door():
    lines = len(README.splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move a topic to docs/"


def test_every_docs_page_opens_with_what_a_reader_finds_there_and_the_readme_maps_it():
    for page in sorted(DOCS.glob("*.md")):
        title, blank, opening = page.read_text().split("\n")[:3]
        assert title.startswith("# ") and blank == "" and opening[:1].isalnum(), page.name
        if page.name != "README.md":
            assert f"](docs/{page.name})" in README, f"README's map lacks docs/{page.name}"


def _anchors(text: str) -> set[str]:
    """GitHub's anchor of every heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#{1,6} (.+)$", text, re.M)
    }


def test_every_relative_link_points_at_a_file_and_a_heading_that_exist():
    broken = []
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def _shell_blocks() -> list[tuple[str, str]]:
    return [
        (page.name, block)
        for page in PAGES
        for block in re.findall(r"^```sh\n(.*?)^```", page.read_text(), re.M | re.S)
    ]


def test_every_script_and_make_target_a_shell_block_shows_exists():
    """A command shown in the docs runs: its script is in the repository and executable, its
    Python file exists, its make target is in the Makefile."""
    blocks = _shell_blocks()
    assert len(blocks) >= 10
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    missing = []
    for page, block in blocks:
        for line in block.splitlines():
            command = line.split("#", 1)[0]
            for target in re.findall(r"\bmake ([\w-]+)", command):
                if target not in targets:
                    missing.append(f"{page}: make {target}")
            for path in re.findall(r"(?<![\w/.])((?:scripts|tools|bench)/[\w./-]+)", command):
                file = ROOT / path
                if not file.is_file() or (file.suffix != ".py" and not file.stat().st_mode & 0o111):
                    missing.append(f"{page}: {path}")
    assert missing == []


def named_tests() -> list[tuple[str, str | None]]:
    """Every test the README and docs/ name as `tests/<file>.py`, `tests/<file>.py::<test>` or,
    after one of those on the same line, `::<test>` (a test of the same file)."""
    named = []
    for page in PAGES:
        for line in page.read_text().splitlines():
            current = None
            for match in re.finditer(r"`(tests/[\w/]+\.py)?(?:::(\w+)(?:\[[^`]*\])?)?`", line):
                file, test = match.groups()
                current = file or current
                if file or test:
                    named.append((current, test))
    return named


def test_every_test_the_docs_name_as_holding_a_boundary_exists():
    """The security model's last column is what a reviewer checks a boundary by: a renamed or
    removed test would leave the row claiming a guard nothing runs."""
    named = named_tests()
    assert len(named) > 50, "the security model names its tests"
    missing = []
    for file, test in named:
        path = ROOT / file if file else None
        if path is None or not path.exists():
            missing.append(f"{file}::{test}")
            continue
        if test and not re.search(rf"^(async )?def {test}\(|^class {test}\b", path.read_text(), re.M):
            missing.append(f"{file}::{test}")
    assert missing == [], "the docs name tests that do not exist"
