"""The baked node image (nodeImage, components/node_image.py), as the mock runtime sees the
program declare it: what each Image Builder resource really receives, the reuse of an image
another stack baked, the builder's least privilege, and what the image may hold."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from node_scratch import install_node_script
from pulumi_mocks import run_stack

from cli.mock_runtime import stack_config
from components import aws_contract, bootstrap, node_env, node_image
from components.spec import SpecError, load_spec

TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
NODE_IMAGE = "vllm-cluster:index:NodeImage"
BASE = "ami-0123456789abcdef0"
LOCK = (node_env.ROOT / node_env.default_lock_path()).read_text()


def baked(run, suffix: str):
    return run.named(f"vllm-node-image{suffix}")


@pytest.fixture(scope="module")
def prod():
    run = run_stack("prod", {"amiId": BASE})
    assert run.error is None, run.error
    return run


def test_the_nodes_launch_from_the_image_baked_on_the_base(prod):
    recipe = baked(prod, "-recipe")
    assert recipe.inputs["parentImage"] == BASE
    image_id = prod.of_type(TEMPLATE)[0].inputs["imageId"]
    assert image_id.startswith("ami-") and image_id != BASE
    # The template waits for the image; the image for the bake's script and permissions.
    image = baked(prod, "-image")
    assert image.urn in prod.of_type(TEMPLATE)[0].dependencies
    assert {baked(prod, s).urn for s in ("-bake-script", "-builder-policy", "-builder-image-builder")} <= set(
        image.dependencies
    )


def test_the_image_is_named_and_tagged_by_the_lock_and_the_base(prod):
    key = node_image.image_key(LOCK, BASE)
    recipe = baked(prod, "-recipe")
    assert recipe.inputs["name"] == f"vllm-cluster-node-{bootstrap.lock_digest(LOCK)}-{BASE}"
    assert recipe.inputs["amiTags"] == {
        "vllm-cluster:node-image": f"{bootstrap.lock_digest(LOCK)}/{BASE}",
        "vllm-cluster:node-lock-sha256": bootstrap.lock_sha256(LOCK),
        "vllm-cluster:base-ami": BASE,
        "vllm-cluster:baked-by": "vllm-cluster/prod",
    }
    # Before any resource: the account's own images with that tag, available ones only.
    lookups = [args for token, args in prod.invokes if token == "aws:ec2/getAmiIds:getAmiIds"]
    assert lookups == [{"owners": ["self"], "filters": node_image.baked_image_filters(key)}]


def test_a_second_stack_launches_from_the_image_it_finds_and_bakes_nothing():
    key = node_image.image_key(LOCK, BASE)
    run = run_stack("h100", {"amiId": BASE}, baked_images={key.tag: "ami-0feedfacefeedface"})
    assert run.error is None, run.error
    assert [r for r in run.resources if NODE_IMAGE in (r.type, r.parent_type)] == []
    assert run.of_type(TEMPLATE)[0].inputs["imageId"] == "ami-0feedfacefeedface"
    # Another lock (or base) is another image: baked anew.
    other = run_stack("h100", {"amiId": "ami-0123456789abcdef1"}, baked_images={key.tag: "ami-0feedfacefeedface"})
    assert other.of_type(TEMPLATE)[0].inputs["imageId"] != "ami-0feedfacefeedface"
    assert other.named("vllm-node-image-recipe").inputs["parentImage"] == "ami-0123456789abcdef1"


def test_the_builder_runs_in_the_private_subnet_with_a_group_that_only_lets_it_out(prod):
    infrastructure = baked(prod, "-infrastructure")
    private = prod.named("vllm-private-subnet")
    assert infrastructure.inputs["subnetId"] == prod.id_of(private)
    group = baked(prod, "-builder-sg")
    assert infrastructure.inputs["securityGroupIds"] == [prod.id_of(group)]
    assert infrastructure.inputs["instanceMetadataOptions"]["httpTokens"] == "required"
    rules = [
        r
        for r in prod.resources
        if r.type.startswith("aws:vpc/securityGroup") and r.inputs["securityGroupId"] == prod.id_of(group)
    ]
    assert {r.type for r in rules} == {aws_contract.EGRESS}
    assert sorted(r.inputs["fromPort"] for r in rules) == [80, 443]


def test_the_builder_role_is_its_own_and_reads_only_the_bake_script(prod):
    role = baked(prod, "-builder-role")
    assert role.parent_type == NODE_IMAGE
    [attachment] = [r for r in prod.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")]
    assert attachment.inputs["policyArn"] == "arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder"
    policy = json.loads(baked(prod, "-builder-policy").inputs["policy"])
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert set(by_sid) == {"RunCommand", "BakeScript"}
    # No Parameter Store, no other bucket, no write.
    assert not [a for a in by_sid["RunCommand"]["Action"] if a.startswith(("ssm:Get", "s3:", "ssm:Put"))]
    script = baked(prod, "-bake-script")
    bucket = baked(prod, "-bucket")
    assert by_sid["BakeScript"] == {
        "Sid": "BakeScript",
        "Effect": "Allow",
        "Action": ["s3:GetObject"],
        "Resource": f"arn:aws:s3/{prod.id_of(bucket)}/{script.inputs['key']}",
    }
    private = baked(prod, "-bucket-private").inputs
    assert all(
        private[k] for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    )


def test_the_component_downloads_and_runs_the_nodes_own_install_step_within_the_inline_limit(prod):
    component = baked(prod, "-component")
    data = component.inputs["data"]
    assert len(data) <= aws_contract.COMPONENT_DATA_MAX_CHARS
    document = json.loads(data)  # JSON is YAML, as AWSTOE reads it
    [build] = document["phases"]
    download, run = build["steps"]
    script = baked(prod, "-bake-script")
    assert download["action"] == "S3Download"
    assert download["inputs"] == [
        {
            "source": f"s3://{prod.id_of(baked(prod, '-bucket'))}/{script.inputs['key']}",
            "destination": node_image.BAKE_SCRIPT_PATH,
        }
    ]
    assert run["action"] == "ExecuteBash"
    assert run["inputs"]["commands"][0] == f"bash {node_image.BAKE_SCRIPT_PATH}"
    assert script.inputs["content"].endswith(f"exec {bootstrap.NODE_COMMAND} bake --facts {bootstrap.BAKE_ENV}\n")
    assert aws_contract.check(prod.resources, prod.id_of).errors == []


def test_the_image_holds_the_lock_and_the_scripts_and_nothing_of_a_stack(prod):
    content = baked(prod, "-bake-script").inputs["content"]
    assert LOCK in content
    # What it writes: the scripts, the library, the lock and what the bake reads; no
    # cluster.env, no secret file, no unit.
    written = set(re.findall(r"^install -D -m \d+ /dev/stdin (\S+) <<", content, re.MULTILINE))
    assert written == {
        bootstrap.LIBRARY_PATH,
        bootstrap.PYTHON_LIBRARY_PATH,
        f"{bootstrap.BIN_DIR}/vllm-cluster-node",
        f"{bootstrap.BIN_DIR}/node-env",
        bootstrap.NODE_LOCK_PATH,
        bootstrap.BAKE_ENV,
    }
    for secret in ("PRIVATE KEY", prod.outputs["apiKey"], prod.outputs["rayToken"]):
        assert secret not in content
    assert "BAKED_LOCK_DIGEST=" + bootstrap.lock_digest(LOCK) in content


def test_a_component_document_over_the_inline_limit_is_caught(prod):
    component = baked(prod, "-component")
    over = type(component)(**{**component.__dict__, "inputs": {**component.inputs, "data": "#" * 16001}})
    at = type(component)(**{**component.__dict__, "inputs": {**component.inputs, "data": "#" * 16000}})
    assert [f.rule for f in aws_contract.check([over]).errors] == ["component-data-size"]
    assert aws_contract.check([at]).errors == []


def test_an_image_builder_name_aws_refuses_is_caught(prod):
    recipe = baked(prod, "-recipe")
    dotted = type(recipe)(**{**recipe.__dict__, "inputs": {**recipe.inputs, "name": "vllm.node"}})
    assert [f.rule for f in aws_contract.check([dotted]).errors] == ["image-builder-name"]


def config(**overrides):
    values = {k.split(":", 1)[1]: v for k, v in stack_config("prod").items() if k.startswith("vllm-cluster:")}
    return {**values, **overrides}


@pytest.mark.parametrize(
    ("overrides", "wanted"),
    [({}, "bake"), ({"nodeImage": "none"}, "none"), ({"nodeImage": "ami-0aaaaaaaaaaaaaaaa"}, "ami-0aaaaaaaaaaaaaaaa")],
)
def test_node_image_takes_bake_none_or_an_ami_id(overrides, wanted):
    assert load_spec(config(**overrides), stack="prod").node_image == wanted


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"nodeImage": "baked"}, "is neither bake, none nor an AMI id"),
        ({"nodeImage": "ami-0aaaaaaaaaaaaaaaa", "amiId": BASE}, "Fix: pulumi config rm vllm-cluster:amiId"),
    ],
)
def test_a_bad_node_image_is_refused_naming_the_key_the_value_and_the_fix(overrides, says):
    with pytest.raises(SpecError) as refused:
        load_spec(config(**overrides), stack="prod")
    text = str(refused.value)
    assert "vllm-cluster:nodeImage" in text and overrides["nodeImage"] in text and says in text


def test_an_image_you_bring_is_launched_as_is_and_no_image_launches_the_base():
    brought = run_stack("prod", {"nodeImage": "ami-0aaaaaaaaaaaaaaaa"})
    assert brought.of_type(TEMPLATE)[0].inputs["imageId"] == "ami-0aaaaaaaaaaaaaaaa"
    assert "imageId" not in brought.of_type(TEMPLATE)[0].ignore_changes  # pinned: a change is deliberate
    for run in (brought, run_stack("prod", {"nodeImage": "none", "amiId": BASE})):
        assert [r for r in run.resources if NODE_IMAGE in (r.type, r.parent_type)] == []
    assert run_stack("prod", {"nodeImage": "none", "amiId": BASE}).of_type(TEMPLATE)[0].inputs["imageId"] == BASE


# --- on the node: setup on a baked image ------------------------------------------------


def install_software_on(tmp_path, baked_for: str | None, writer: bool) -> subprocess.CompletedProcess:
    """vllm-cluster-node's install_software under a scratch root (tests/node_scratch.py), with
    a virtualenv double whose check passes (the environment is the lock's) and the wheelhouse
    writer's fill replaced by a line saying it ran: which of the two setup does."""
    root = tmp_path / "root"
    script = install_node_script(root, "")
    install = root / "opt/vllm-cluster"
    (install / "node-env.lock").write_text(LOCK)
    if baked_for is not None:
        (install / "baked-lock").write_text(baked_for + "\n")
    python = install / "venv/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n# double: the virtualenv's check passes\nexit 0\n")
    python.chmod(0o755)
    runner = (
        script.read_text().removesuffix('main "$@"\n')
        + "fill_wheelhouse() { echo FILLED-THE-WHEELHOUSE >&2; }\n"
        + "install_software /mnt/vllm-wheelhouse\n"
    )
    env = {
        "PATH": f"{root}/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "IMAGE_PYTHON": sys.executable,
        "WHEELHOUSE_WRITER": "true" if writer else "false",
        "WHEELHOUSE_WRITER_NODE": "head",
    }
    return subprocess.run(["bash", "-c", runner], capture_output=True, text=True, env=env, timeout=60)


def test_setup_on_an_image_baked_for_its_lock_only_checks_and_leaves_the_wheelhouse_alone(tmp_path):
    done = install_software_on(tmp_path, bootstrap.lock_digest(LOCK), writer=True)
    assert done.returncode == 0, done.stderr
    assert "FILLED-THE-WHEELHOUSE" not in done.stderr
    assert "the virtualenv is the lock's environment already" in done.stderr


@pytest.mark.parametrize("baked_for", [None, "0123456789ab"])
def test_the_writer_fills_the_wheelhouse_unless_its_image_was_baked_for_the_lock(tmp_path, baked_for):
    """No image, or one baked for another lock: a node that installs may need the wheels."""
    done = install_software_on(tmp_path, baked_for, writer=True)
    assert done.returncode == 0, done.stderr
    assert "FILLED-THE-WHEELHOUSE" in done.stderr


def test_the_bake_refuses_a_lock_other_than_the_one_it_was_sent_for(tmp_path):
    root = tmp_path / "root"
    script = install_node_script(root, "")
    install = root / "opt/vllm-cluster"
    (install / "node-env.lock").write_text(LOCK)
    (install / "bake.env").write_text(bootstrap.bake_env(LOCK).replace(bootstrap.lock_digest(LOCK), "0123456789ab"))
    env = {"PATH": f"{root}/bin:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(script), "bake", "--facts", str(install / "bake.env")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1
    assert f"was written for the lock 0123456789ab, but {install}/node-env.lock is {bootstrap.lock_digest(LOCK)}" in (
        done.stderr
    )


def bake_on(tmp_path, facts: str, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    """vllm-cluster-node bake under a scratch root, its install steps replaced by lines
    saying they ran (setup's own steps, tested with setup): what the bake does around them."""
    root = tmp_path / "root"
    script = install_node_script(root, "")
    install = root / "opt/vllm-cluster"
    (install / "node-env.lock").write_text(LOCK)
    (tmp_path / "facts.env").write_text(facts)
    runner = (
        script.read_text().removesuffix('main "$@"\n')
        + 'install_node_software() { echo "INSTALLED-FROM $1" >&2; }\n'
        + "install_efs_utils() { echo BUILT-EFS-UTILS >&2; }\n"
        + "hold_setup_lock() { :; }\n"
        + "apt-get() { echo APT-GET-$1 >&2; }\n"
        + 'cmd_bake "$@"\n'
    )
    env = {"PATH": f"{root}/bin:/usr/bin:/bin", "HOME": str(tmp_path), "IMAGE_PYTHON": sys.executable}
    command = ["bash", "-c", runner, "bake", "--facts", str(tmp_path / "facts.env"), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60), install


def test_the_gpu_image_bake_builds_efs_utils_marks_the_lock_and_keeps_no_wheels(tmp_path):
    """The GPU nodes' image (bake.env): efs-utils built in, the image marked baked for its
    lock (so setup on it fills no wheelhouse), and the bake's own wheelhouse gone."""
    done, install = bake_on(tmp_path, bootstrap.bake_env(LOCK))
    assert done.returncode == 0, done.stderr
    assert "BUILT-EFS-UTILS" in done.stderr and "APT-GET-clean" in done.stderr
    assert (install / "baked-lock").read_text().strip() == bootstrap.lock_digest(LOCK)
    wheelhouse = Path(re.search(r"INSTALLED-FROM (\S+)", done.stderr).group(1))
    assert not wheelhouse.exists()


def test_the_local_host_image_bake_leaves_efs_and_the_wheelhouse_to_its_hosts(tmp_path):
    """The local hosts' image (facts without BAKED_LOCK_DIGEST or EFS_UTILS_VERSION): own
    hosts mount no EFS and their head fills the wheelhouse for hosts not baked, so the
    image is not marked baked, and the caller's wheelhouse is filled and kept."""
    facts = f"IMAGE_PYTHON={sys.executable}\nIPTABLES=/usr/sbin/iptables\nNFT=/usr/sbin/nft\nSERVICE_USER=vllm\n"
    house = tmp_path / "house"
    house.mkdir()
    done, install = bake_on(tmp_path, facts, "--wheelhouse", str(house))
    assert done.returncode == 0, done.stderr
    assert f"INSTALLED-FROM {house}" in done.stderr and house.is_dir()
    assert "BUILT-EFS-UTILS" not in done.stderr and "APT-GET-clean" not in done.stderr
    assert not (install / "baked-lock").exists()
