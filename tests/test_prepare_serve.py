"""The stack's prepare command and the boot's vllm-prepare.service share one record: the
arguments prepare-serve keeps (prepare-serve.args), which the unit's ConditionPathExists
and `prepare-serve --saved` read at every boot. Ray's units pull vllm-prepare.service in
(Wants= and After=), so at the first bring-up, when gang 0's prepare copies its stage
while the model still lands (--model-landing) and the head's download waits for the Ray
cluster, a record kept before the copy ends would let Ray's start run the unit, which
waits for the stack's prepare (its lock), which waits for the download, which waits for
Ray: the fleet saw ray-head.service never start (600 s, no journal line). So the record
is kept only once this node's stage is complete: later boots prepare from it, the first
start of Ray finds nothing to prepare.

vllm-cluster-node runs under a scratch root (tests/node_scratch.py), its model-stage and
the commands around the copy replaced by stand-ins that say what they were asked."""

from __future__ import annotations

import subprocess
import sys

from node_scratch import install_node_script

from components import stage_volume

NODE_ENV = "NODE_IP=10.0.0.1\nHEAD_IP=10.0.0.1\nGPUS_PER_NODE=1\n"


def prepare(tmp_path, copy_exit: int) -> tuple[subprocess.CompletedProcess, object]:
    root = tmp_path / "root"
    script = install_node_script(root, NODE_ENV)
    install = root / "opt/vllm-cluster"
    cluster_env = f"SERVICE_USER=vllm\nINSTANCE_STORE=false\nNVME_MOUNT={tmp_path}/nvme\n"
    # No instance metadata answers here (as on your own hosts): no stage volume
    # (tests/test_stage_volume_node.py has the node launched with one).
    cluster_env += f"INSTANCE_METADATA_URL=http://127.0.0.1:9\nLOCAL_MODEL_ROOT={tmp_path}/nvme/vllm-cluster/models\n"
    cluster_env += "".join(
        f"{key}={value}\n"
        for key, value in (
            ("IMDS_TOKEN_PATH", stage_volume.IMDS_TOKEN_PATH),
            ("STAGE_VOLUME_IMDS_MAPPINGS", stage_volume.IMDS_BLOCK_DEVICE_MAPPING),
            ("STAGE_VOLUME_DEVICE_NAME", stage_volume.STAGE_VOLUME_DEVICE_NAME),
        )
    )
    (root / "etc/vllm-cluster/cluster.env").write_text(cluster_env)
    (install / "venv/bin").mkdir(parents=True)
    # The copy: model-stage local, run by the venv's Python (a stand-in that exits as told).
    python = install / "venv/bin/python"
    python.write_text(f'#!/bin/sh\n# stand-in: model-stage\'s copy\necho COPY "$@" >&2\nexit {copy_exit}\n')
    python.chmod(0o755)
    runner = (
        # The engine's compile cache under the scratch root too.
        script.read_text()
        .removesuffix('main "$@"\n')
        .replace("/var/cache/vllm-cluster", f"{root}/var/cache/vllm-cluster")
        + "mountpoint() { return 0; }\n"
        + "prune_local_models() { :; }\n"
        + "open_local_model_to_service() { :; }\n"
        + "chown() { :; }\n"
        + 'cmd_prepare_serve "$@"\n'
    )
    args = ["--model-dir", "/mnt/vllm-models/m/main", "--warmup-key", "k", "--local-dir", f"{tmp_path}/stage/m"]
    args += ["--gang-ips", "10.0.0.1", "--tp", "1", "--pp", "1", "--model-landing", "true"]
    env = {"PATH": f"{root}/bin:/usr/bin:/bin", "HOME": str(tmp_path), "IMAGE_PYTHON": sys.executable}
    done = subprocess.run(["bash", "-c", runner, "prepare-serve", *args], capture_output=True, text=True, env=env)
    return done, root / "etc/vllm-cluster/prepare-serve.args"


def test_a_copy_that_has_not_ended_keeps_no_record_for_the_boots_unit(tmp_path):
    done, record = prepare(tmp_path, copy_exit=1)
    assert done.returncode != 0 and "COPY" in done.stderr, done.stderr
    assert not record.exists(), "a boot (or Ray's start) would prepare from a stage that is not complete"


def test_a_complete_copy_keeps_the_record_later_boots_prepare_from(tmp_path):
    done, record = prepare(tmp_path, copy_exit=0)
    assert "COPY" in done.stderr, done.stderr
    assert record.exists(), done.stderr
    assert "--model-landing true" in record.read_text()
