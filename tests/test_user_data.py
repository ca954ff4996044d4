"""User data as EC2 receives it, on every instance of every stack file.

EC2 refuses RunInstances when the user data is over 16 KB "in raw form, before it is
base64-encoded" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html):
an instance's `userData` counts as its text, a `userDataBase64` as the bytes it decodes
to (gzip, here). The checks read the inputs the program declared under the mock
runtime, not a helper's output: a helper's packed text passed while the gateway
instance was handed 31 KB of plain text."""

import base64
import gzip

import pytest
from pulumi_mocks import ec2_stack_names, run_stack, unsecret

from components import bootstrap, host_keys

STACKS = ec2_stack_names()
INSTANCE = "aws:ec2/instance:Instance"
EC2_USER_DATA_LIMIT_BYTES = 16 * 1024


def raw_user_data(inputs: dict) -> bytes | None:
    """The user data's raw form, as EC2 measures it."""
    if inputs.get("userDataBase64"):
        return base64.b64decode(unsecret(inputs["userDataBase64"]))
    if inputs.get("userData"):
        return unsecret(inputs["userData"]).encode()
    return None


def as_cloud_init_reads_it(raw: bytes) -> str:
    """The script cloud-init's final stage runs: it unpacks gzip user data by itself (its
    magic bytes), and takes a MIME multipart apart (the host key's cloud-config beside
    the script, components/host_keys.py)."""
    return host_keys.user_data_parts((gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()).script


@pytest.fixture(scope="module", params=STACKS)
def run(request):
    result = run_stack(request.param)
    assert result.error is None, result.error
    return result


def test_every_instance_is_handed_user_data_ec2_accepts(run):
    sizes = {instance.name: len(raw_user_data(instance.inputs) or b"") for instance in run.of_type(INSTANCE)}
    too_large = {name: size for name, size in sizes.items() if size > EC2_USER_DATA_LIMIT_BYTES}
    assert too_large == {}, f"over EC2's {EC2_USER_DATA_LIMIT_BYTES} bytes of raw user data: {too_large}"


def test_the_gateway_boots_with_its_bootstrap_script(run):
    """Smaller, but still the script that installs nginx and the gateway command at
    first boot (the setup command sends the same script again)."""
    gateway = run.named("vllm-gateway-host", INSTANCE)
    raw = raw_user_data(gateway.inputs)
    assert raw is not None
    assert as_cloud_init_reads_it(raw) == bootstrap.gateway_user_data()


def test_a_changed_gateway_script_does_not_replace_or_restart_the_gateway(run):
    """Changing an instance's user data stops and starts it (or replaces it): a new
    gateway script reaches the running gateway through its setup command instead."""
    gateway = run.named("vllm-gateway-host", INSTANCE)
    declared = {key for key in ("userData", "userDataBase64") if gateway.inputs.get(key)}
    assert declared and declared <= set(gateway.ignore_changes)
