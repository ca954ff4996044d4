"""The node image: its facts (components/image.py) against what the program pins
and looks up, so a pin that drops the image's Python, or a lookup of the wrong
image, fails here instead of at `pulumi up`."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from components import bootstrap, image, versions
from tests.pulumi_mocks import run_stack
from tests.test_bootstrap import boot, parse_env

ROOT = Path(__file__).resolve().parent.parent
NODE_SCRIPT = (ROOT / "scripts" / "node" / "vllm-cluster-node").read_text()
PINS = (("vllm", versions.VLLM_VERSION), ("ray", versions.RAY_VERSION))


def test_every_pinned_release_records_the_python_it_requires():
    for release in PINS:
        assert release in versions.REQUIRES_PYTHON, (
            f"add {release} to versions.REQUIRES_PYTHON (tools/requires_python.py)"
        )


def test_the_pinned_vllm_and_ray_run_on_the_images_python():
    bounds = versions.python_bounds(*PINS)
    assert bounds is not None and versions.python_accepts(bounds, image.PYTHON_VERSION), (
        f"vLLM {versions.VLLM_VERSION} / Ray {versions.RAY_VERSION} need Python {bounds}; "
        f"the node image has {image.python_label()}"
    )
    assert image.PYTHON.endswith(image.python_label())


def test_the_ubuntu_22_04_images_python_would_be_refused():
    # What broke every stack: the 22.04 image's 3.10 against vLLM 0.33's >=3.11.
    assert not versions.python_accepts(versions.python_bounds(*PINS), (3, 10))


def test_requirements_are_read_strictly():
    assert versions.python_bounds(("vllm", "0.0.1")) is None
    versions.REQUIRES_PYTHON[("vllm", "0.0.2")] = "~=3.11"
    try:
        with pytest.raises(ValueError, match="only >= and <"):
            versions.python_bounds(("vllm", "0.0.2"))
    finally:
        del versions.REQUIRES_PYTHON[("vllm", "0.0.2")]


def test_the_program_looks_up_the_ubuntu_24_04_deep_learning_base_ami():
    run = run_stack("dev")
    # The GPU nodes' lookup (the gateway looks up Canonical's own Ubuntu image).
    amis = [
        args
        for token, args in run.invokes
        if token == "aws:ec2/getAmi:getAmi" and args.get("owners") != ["099720109477"]
    ]
    assert amis, "no AMI lookup for the GPU nodes"
    for args in amis:
        names = [f["values"] for f in args["filters"] if f["name"] == "name"]
        assert names == [[image.DLAMI_NAME_PATTERN]] and args["owners"] == [image.DLAMI_OWNER]
    assert "(Ubuntu 24.04)" in image.DLAMI_NAME_PATTERN


def test_cluster_env_carries_the_image_facts_the_node_scripts_use():
    env = parse_env(bootstrap.cluster_env(boot(1)))
    assert env["IMAGE_PYTHON"] == image.PYTHON
    assert (env["PYTHON_MIN"], env["PYTHON_BELOW"]) == ("3.11", "3.15")
    assert env["FI_INFO"] == image.FI_INFO and env["NVIDIA_SMI"] == image.NVIDIA_SMI
    assert env["EFA_LIB_DIR"] == image.EFA_LIB_DIR and env["OFI_NCCL_LIB_DIRS"].split() == list(image.OFI_NCCL_LIB_DIRS)
    assert env["LOGIN_USER"] == image.DEFAULT_USER
    # No tool path is written into the node scripts: they read these from the env files.
    for fact in (image.FI_INFO, image.EFA_BIN_DIR, image.PYTHON, "/opt/amazon/ofi-nccl"):
        assert fact not in NODE_SCRIPT
        assert fact not in (ROOT / "scripts" / "node" / "preflight-check").read_text()


def run_check_python(tmp_path: Path, python_version: str, python_min: str, python_below: str):
    """The setup's Python check, against a stand-in python3 that reports `python_version`."""
    fake = tmp_path / "python3"
    fake.write_text(f"#!/bin/sh\necho {python_version}\n")
    fake.chmod(0o755)
    functions = "".join(
        re.search(rf"\n({name}\(\) \{{.*?\n\}}\n)", NODE_SCRIPT, re.S).group(1)
        for name in ("node_python", "check_python", "version_at_least")
    )
    library = (ROOT / "scripts" / "lib" / "vllm-cluster-lib.sh").read_text()
    script = (
        f"set -euo pipefail\n{library}\n{functions}\n"
        f"IMAGE_PYTHON={tmp_path}/absent VLLM_VERSION=0.33.0 RAY_VERSION=2.60.0 "
        f"PYTHON_MIN={python_min} PYTHON_BELOW={python_below}\nPATH={tmp_path}:$PATH\ncheck_python\n"
    )
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True)


def test_setup_refuses_a_python_the_pins_do_not_accept_naming_it_the_requirement_and_the_fix(tmp_path):
    refused = run_check_python(tmp_path, "3.10", "3.11", "3.15")
    assert refused.returncode != 0
    assert "Python is 3.10" in refused.stderr and ">=3.11,<3.15" in refused.stderr
    assert "leave amiId empty" in refused.stderr and "Ubuntu 24.04" in refused.stderr
    too_new = run_check_python(tmp_path, "3.15", "3.11", "3.15")
    assert too_new.returncode != 0 and "Python is 3.15" in too_new.stderr


def test_setup_accepts_a_python_inside_the_requirement(tmp_path):
    for version in ("3.11", "3.12", "3.14"):
        accepted = run_check_python(tmp_path, version, "3.11", "3.15")
        assert accepted.returncode == 0, accepted.stderr


def test_the_node_looks_for_the_nccl_plugin_the_image_fact_names():
    """vllm-cluster-node write_node_env checks for the file components/image.py names."""
    assert "local plugin_file=$OFI_NCCL_PLUGIN_FILE " in NODE_SCRIPT
    assert parse_env(bootstrap.cluster_env(boot(1)))["OFI_NCCL_PLUGIN_FILE"] == image.OFI_NCCL_PLUGIN
    assert image.OFI_NCCL_PLUGIN not in NODE_SCRIPT


def test_the_images_driver_runs_the_gpu_locks_cuda_runtime():
    """Preflight refuses a driver older than the lock's CUDA runtime needs: the image the
    program looks up must pass, so a lock that moves to a newer CUDA fails here first."""
    from cli.preflight import node_checks

    lock = (ROOT / "locks" / "node-gpu-py{}{}-x86_64.txt".format(*image.PYTHON_VERSION)).read_text()
    required = node_checks().required_cuda(lock)
    assert required is not None and int(required.split(".")[0]) <= image.DRIVER_CUDA_MAJOR, (
        f"the GPU lock's CUDA runtime needs CUDA {required}; the image's driver has CUDA {image.DRIVER_CUDA_MAJOR}"
    )
