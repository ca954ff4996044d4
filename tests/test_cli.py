"""The operator CLI's shape (scripts/vllm-cluster): `status` and `preflight` start
without the Pulumi engine, only the mock runtime touches the Pulumi SDK, and every
command answers a stack file it cannot use with one line naming the file, never
a traceback."""

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from pulumi_mocks import stack_config

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "scripts" / "vllm-cluster"


def fresh_python(code: str) -> subprocess.CompletedProcess:
    """`code` in a new interpreter at the repository root: what other tests imported
    into this one cannot hide an import."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.parametrize("module", ["cli.status", "cli.preflight"])
def test_status_and_preflight_import_no_pulumi(module):
    result = fresh_python(
        f"import sys, {module}\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'pulumi_command', 'pulumi_aws'))\n"
        "assert not loaded, loaded\n"
    )
    assert result.returncode == 0, result.stderr


def test_importing_preflight_runs_no_node_script():
    result = fresh_python("import cli.preflight as p; assert p.node_checks.cache_info().currsize == 0")
    assert result.returncode == 0, result.stderr


def test_only_the_mock_runtime_imports_the_pulumi_sdk():
    importers = []
    for path in sorted((ROOT / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(name.split(".")[0].startswith("pulumi") for name in names):
                importers.append(path.name)
    assert sorted(set(importers)) == ["mock_runtime.py"]


# Stack files an operator could write, each with a fragment its one line must carry.
# A value of the wrong type must be refused as cleanly as a wrong value.
DEV = stack_config("dev")
BAD_STACK_FILES = {
    "a wrong type Pulumi.yaml declares": ({**DEV, "vllm-cluster:nodes": "two"}, 'nodes ("two"'),
    "a wrong type the spec finds": ({**DEV, "vllm-cluster:model": 5}, "vllm-cluster:model = 5"),
    "an unknown key": ({**DEV, "vllm-cluster:nodez": 2}, "did you mean nodes"),
    "several problems": ({**DEV, "vllm-cluster:nodes": 0, "vllm-cluster:nodez": 2}, "2 problems"),
    "a missing required key": ({k: v for k, v in DEV.items() if k != "vllm-cluster:model"}, "missing"),
    "not YAML": ("config:\n  vllm-cluster:nodes: [1\n", "not valid YAML"),
    "not a stack file": ("- vllm-cluster:nodes\n", "not a stack file"),
    "no file": (None, "no such stack file"),
}
# What a command exits with when it could not look; status calls that "unknown".
CANNOT_LOOK = {"plan": 2, "preflight": 2, "status": 3}


def write_stack_file(path: Path, content) -> None:
    if content is None:
        return
    path.write_text(content if isinstance(content, str) else yaml.safe_dump({"config": content}))


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(TOOL), *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("command", sorted(CANNOT_LOOK))
@pytest.mark.parametrize("case", sorted(BAD_STACK_FILES))
def test_a_stack_file_the_tool_cannot_use_is_one_line_naming_it(tmp_path, command, case):
    content, fragment = BAD_STACK_FILES[case]
    stack_file = tmp_path / "Pulumi.bad.yaml"
    write_stack_file(stack_file, content)
    # Outputs that do not exist: a stack file wrongly accepted would end in an error
    # naming them (and not the stack file) instead of calling the Pulumi CLI.
    outputs = [] if command == "plan" else ["--outputs", str(tmp_path / "no-outputs.json")]
    result = run_tool(command, "--stack", "bad", "--stack-file", str(stack_file), *outputs)
    assert result.returncode == CANNOT_LOOK[command], result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"vllm-cluster {command}: {stack_file}: ") and fragment in lines[0], lines[0]


def test_a_mistyped_secret_is_named_but_not_shown(tmp_path):
    stack_file = tmp_path / "Pulumi.bad.yaml"
    write_stack_file(stack_file, {**DEV, "vllm-cluster:apiKey": ["sk-not-for-the-terminal-0123456789"]})
    result = run_tool("status", "--stack", "bad", "--stack-file", str(stack_file))
    assert result.returncode == 3 and "apiKey" in result.stderr
    assert "sk-not-for-the-terminal" not in result.stderr


def test_outputs_the_tool_cannot_use_are_one_line_naming_them(tmp_path):
    stack_file, outputs = tmp_path / "Pulumi.dev.yaml", tmp_path / "outputs.json"
    write_stack_file(stack_file, DEV)
    for content, fragment in (("{", "not JSON"), ('{"endpoint": "https://203.0.113.9"}', "no gatewayPublicIp")):
        outputs.write_text(content)
        result = run_tool("status", "--stack", "dev", "--stack-file", str(stack_file), "--outputs", str(outputs))
        assert result.returncode == 3 and result.stdout == ""
        assert result.stderr.splitlines() == [result.stderr.strip()] and fragment in result.stderr, result.stderr
        assert str(outputs) in result.stderr


def loopback_outputs(tls_certificate: str | None) -> dict:
    """A deployed stack's outputs on loopback only: the gateway's logins and the endpoint
    are refused at once."""
    return {
        "gatewayPublicIp": "127.0.0.1",
        "headPrivateIp": "127.0.0.2",
        "sshPrivateKey": "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n",
        "sshKnownHosts": "127.0.0.1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKYOUwo2FQkkY+GgpiI0nKgsvB1BjihLoOYxJzBau5PQ\n",
        "endpoint": "https://127.0.0.1:9/v1",
        "apiKey": "sk-test",
        "tlsCertificate": tls_certificate,
    }


@pytest.mark.parametrize("certificate", ["", None, "not a certificate"], ids=["empty", "null", "not-pem"])
def test_a_tls_certificate_output_that_is_no_certificate_is_one_line_naming_it(tmp_path, certificate):
    """The tools trust the stack's own certificate to reach the endpoint; an outputs file
    whose tlsCertificate is empty or no PEM certificate made `status` end in a traceback."""
    stack_file, outputs = tmp_path / "Pulumi.dev.yaml", tmp_path / "outputs.json"
    write_stack_file(stack_file, DEV)
    outputs.write_text(json.dumps(loopback_outputs(certificate)))
    result = run_tool("status", "--stack", "dev", "--stack-file", str(stack_file), "--outputs", str(outputs))
    assert result.returncode == 3 and result.stdout == "", result.stderr
    assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr
    assert str(outputs) in result.stderr and "tlsCertificate" in result.stderr, result.stderr


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["terminal-closed", "terminated"])
def test_a_watch_ended_by_a_signal_leaves_no_copy_of_the_ssh_key(tmp_path, sig):
    """The tools write the stack's SSH private key to a private temporary folder for ssh
    to read, and remove it when they end. `status --watch` runs until it is stopped: a
    closed terminal (SIGHUP, as `tmux kill-session` sends) or a kill (SIGTERM) ended it
    without that, and each left a key to every node in /tmp."""
    stack_file, outputs, scratch = tmp_path / "Pulumi.dev.yaml", tmp_path / "outputs.json", tmp_path / "tmp"
    write_stack_file(stack_file, DEV)
    scratch.mkdir()
    key, certificate = tmp_path / "tls.key", tmp_path / "tls.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ed25519", "-nodes", "-subj", "/CN=127.0.0.1"]
        + ["-keyout", str(key), "-out", str(certificate), "-days", "1"],
        check=True,
        capture_output=True,
    )
    outputs.write_text(json.dumps(loopback_outputs(certificate.read_text())))
    args = ["status", "--stack", "dev", "--stack-file", str(stack_file), "--outputs", str(outputs), "--watch"]
    # The signal's default disposition, as in a terminal: a test run started with nohup
    # (or in the background) hands its children SIGHUP ignored, and the tool keeps an
    # ignored SIGHUP ignored.
    tool = subprocess.Popen(
        [str(TOOL), *args, "--interval", "1"],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(scratch)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        while not list(scratch.glob("vllm-cluster-*/key")):
            assert tool.poll() is None and time.monotonic() < deadline, tool.stderr.read().decode()[-2000:]
            time.sleep(0.1)
        tool.send_signal(sig)
        assert tool.wait(timeout=30) == 128 + sig
        assert list(scratch.iterdir()) == []
    finally:
        if tool.poll() is None:
            tool.kill()
            tool.wait()
        tool.stderr.close()
