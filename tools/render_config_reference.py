"""Writes docs/configuration-reference.md, the table of every config key, from
components/config_keys.py's CONFIG_KEYS, the one source of the config contract. Run it
after changing a key:

    python tools/render_config_reference.py      (or: make config-reference)

tests/test_readme.py fails while the file and the keys differ.

Which stacks may set a key is not a field of a key, so it is derived from the rules the
spec applies (issue 37):
- `hosts` makes a stack of hosts;
- the keys of the instances the stack creates (components/spec/own_hosts.py CREATED_INSTANCE_KEYS)
  are refused with hosts: EC2 stacks only;
- a key whose description opens "With hosts" describes the user's machines and is refused
  without them: stacks of hosts only;
- a key whose description says "not with ... hosts" is refused with hosts: EC2 stacks only;
- a key whose description opens "With <key>:" needs that key, so it goes where that key
  goes (wakeGiveUpMinutes with idleStopMinutes);
- every other key: any stack.
tests/test_readme.py holds each restricted key to the spec: set on a stack of the other
kind, it is refused naming the key. Beside it, the stack files of stacks/ that set the
key today.
"""

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.config_keys import CONFIG_KEYS, KEYS_BY_NAME, NAMESPACE, ConfigKey  # noqa: E402
from components.spec import CREATED_INSTANCE_KEYS  # noqa: E402

REFERENCE = ROOT / "docs" / "configuration-reference.md"
STACKS_DIR = ROOT / "stacks"

# The values of the column "stacks that may set it", and the rules read from a key's
# description (the module's docstring).
EC2, HOSTS, ANY = "EC2", "hosts", "any"
MAKES_HOSTS = "any: it makes the stack one of hosts"
_NEEDS_KEY = re.compile(r"^With (\w+)[ :]")
_NOT_WITH_HOSTS = re.compile(r"\b[Nn]ot with [^.]*\bhosts\b")

HEADER = f"""# Configuration reference

Every key a stack file may set, under the namespace `{NAMESPACE}` (`{NAMESPACE}:model` in
`stacks/Pulumi.<stack>.yaml`). Generated from `components/config_keys.py` by
`tools/render_config_reference.py` (`make config-reference`); do not edit it by hand,
`tests/test_readme.py` fails while the two differ. The conventions (defaults that mean "not
set", secrets, `efa` as a string) and the node software are in
[configuration.md](configuration.md).

*Stacks that may set it*: **{EC2}**, only a stack whose instances the program creates on AWS (no
`hosts`); the spec refuses it with `hosts`, naming the key. **{HOSTS}**, only a stack of machines you
already have (`hosts` set; [own-hosts.md](own-hosts.md)); refused without them. **{ANY}**, either.
*Set in stacks/ today*: the stack files of `stacks/` that set it.
"""


def stack_configs() -> dict[str, dict]:
    """Each stack file's `vllm-cluster:` keys, by stack name, in name order."""
    configs = {}
    for path in sorted(STACKS_DIR.glob("Pulumi.*.yaml")):
        config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
        prefix = f"{NAMESPACE}:"
        configs[path.name[len("Pulumi.") : -len(".yaml")]] = {
            name[len(prefix) :]: value for name, value in config.items() if name.startswith(prefix)
        }
    return configs


def stacks_that_may_set(key: ConfigKey) -> str:
    """EC2, hosts, any, or for `hosts` itself what it does (the rules of the module's docstring)."""
    if key.name == "hosts":
        return MAKES_HOSTS
    if key.name in CREATED_INSTANCE_KEYS or _NOT_WITH_HOSTS.search(key.description):
        return EC2
    needs = _NEEDS_KEY.match(key.description)
    if needs and needs.group(1) == "hosts":
        return HOSTS
    if needs and needs.group(1) in KEYS_BY_NAME:
        return stacks_that_may_set(KEYS_BY_NAME[needs.group(1)])
    return ANY


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    configs = stack_configs()
    lines = [
        HEADER,
        "| key | type | default | what it does | stacks that may set it | set in stacks/ today |",
        "|---|---|---|---|---|---|",
    ]
    for key in CONFIG_KEYS:
        default = "required" if key.required else f"`{json.dumps(key.default)}`"
        setting = ", ".join(f"`{stack}`" for stack, config in configs.items() if key.name in config) or "none"
        lines.append(
            f"| `{key.name}` | {key.type} | {default} | {_cell(key.description)} | "
            f"{stacks_that_may_set(key)} | {setting} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    REFERENCE.write_text(render())


if __name__ == "__main__":
    main()
