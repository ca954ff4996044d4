"""Writes Pulumi.yaml's `config:` block from components/config_keys.py's CONFIG_KEYS, the
one source of the config contract. Run it after changing a key:

    python tools/render_pulumi_yaml.py

tests/test_project_file.py fails while the two disagree."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.config_keys import CONFIG_KEYS  # noqa: E402

MARKER = "config:\n"


def render_config() -> str:
    lines = [MARKER.rstrip("\n")]
    for key in CONFIG_KEYS:
        lines.append(f"  {key.name}:")
        lines.append(f"    type: {key.type}")
        if key.type == "array":
            lines += ["    items:", "      type: string"]
        # JSON strings are valid YAML scalars and survive colons and quotes.
        lines.append(f"    description: {json.dumps(key.description)}")
        if not key.required:
            lines.append(f"    default: {json.dumps(key.default)}")
    return "\n".join(lines) + "\n"


def main() -> None:
    path = ROOT / "Pulumi.yaml"
    text = path.read_text()
    head = text[: text.index(MARKER)] if MARKER in text else text
    path.write_text(head + render_config())


if __name__ == "__main__":
    main()
