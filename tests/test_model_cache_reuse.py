"""modelCacheFileSystemId: a stack reuses a kept model cache (retainModelCache on a
destroyed stack) instead of creating an empty one, on what each resource really receives
under the mock runtime; a file system the stack's mount target could not join (another
VPC, a mount target in the nodes' zone, a One Zone file system elsewhere) is refused before
any resource, naming the fix."""

import pytest
from pulumi_mocks import ec2_stack_names, run_stack

from components.spec import SpecError, load_spec

FS = "fs-0123456789abcdef0"
FILE_SYSTEM = "aws:efs/fileSystem:FileSystem"
MOUNT_TARGET = "aws:efs/mountTarget:MountTarget"
ACCESS_POINT = "aws:efs/accessPoint:AccessPoint"
POLICY = "aws:efs/fileSystemPolicy:FileSystemPolicy"
EXISTING_NETWORK = {
    "vpcId": "vpc-0123456789abcdef0",
    "publicSubnetId": "subnet-0123456789abcdef0",
    "privateSubnetId": "subnet-0fedcba9876543210",
}


@pytest.mark.parametrize("stack", ec2_stack_names())
def test_a_kept_cache_is_reused_with_the_stacks_own_mount_target_access_point_and_policy(stack):
    run = run_stack(stack, {"modelCacheFileSystemId": FS})
    assert run.error is None, run.error
    assert run.of_type(FILE_SYSTEM) == []
    # One mount target and policy; the model tree's and the wheelhouse's access points.
    for type_, count in ((MOUNT_TARGET, 1), (ACCESS_POINT, 2), (POLICY, 1)):
        resources = run.of_type(type_)
        assert len(resources) == count, type_
        assert all(resource.inputs["fileSystemId"] == FS for resource in resources), type_
    assert (
        FS in run.of_type(POLICY)[0].inputs["policy"]
        and "aws:SecureTransport" in run.of_type(POLICY)[0].inputs["policy"]
    )
    assert run.outputs["modelCacheFileSystemId"] == FS
    # The lookups ran before any resource: the file system and its mount targets.
    tokens = [token for token, _ in run.invokes]
    assert "aws:efs/getFileSystem:getFileSystem" in tokens


def test_with_a_kept_cache_the_file_system_is_never_the_stacks_to_delete():
    run = run_stack("h100", {"modelCacheFileSystemId": FS, "retainModelCache": False})
    assert run.error is None and run.of_type(FILE_SYSTEM) == []


def test_without_the_key_the_stack_creates_its_own_file_system():
    run = run_stack("dev")
    assert run.error is None
    [file_system] = run.of_type(FILE_SYSTEM)
    assert run.of_type(MOUNT_TARGET)[0].inputs["fileSystemId"] == run.id_of(file_system)


@pytest.mark.parametrize("value", ["fs-123", "fsap-0123456789abcdef0", "fs-0123456789ABCDEF0", "fs-01234567;id"])
def test_a_value_that_is_not_a_file_system_id_is_refused(value):
    config = {
        "model": "Qwen/Qwen2.5-1.5B-Instruct",
        "instanceType": "g6.xlarge",
        "apiAllowedCidrs": ["203.0.113.0/24"],
        "adminCidrs": ["198.51.100.7/32"],
        "modelCacheFileSystemId": value,
    }
    with pytest.raises(SpecError) as caught:
        load_spec(config, stack="t")
    assert caught.value.keys == ["modelCacheFileSystemId"] and "fs-0123456789abcdef0" in str(caught.value)


def refused(stack, overrides, model_cache):
    run = run_stack(stack, {"modelCacheFileSystemId": FS, **overrides}, model_cache=model_cache)
    assert run.error is not None and type(run.error).__name__ == "RunError"
    assert run.resources == []
    assert f'vllm-cluster:modelCacheFileSystemId = "{FS}"' in str(run.error)
    return str(run.error)


def test_a_cache_with_mount_targets_in_another_vpc_is_refused_before_any_resource():
    error = refused("dev", {}, {"mountTargets": [{"vpcId": "vpc-0aaaaaaaaaaaaaaaa", "availabilityZone": "us-east-1a"}]})
    assert "vpc-0aaaaaaaaaaaaaaaa" in error and "aws efs delete-mount-target --mount-target-id fsmt-" in error


def test_a_cache_with_a_mount_target_in_the_nodes_zone_is_refused_with_the_fix():
    # An existing network: the private subnet's zone (the mock's getSubnet: us-east-1b).
    error = refused(
        "dev",
        EXISTING_NETWORK,
        {"mountTargets": [{"vpcId": EXISTING_NETWORK["vpcId"], "availabilityZone": "us-east-1b"}]},
    )
    assert "one mount target per zone" in error and "us-east-1b" in error
    assert "aws efs delete-mount-target --mount-target-id fsmt-" in error


def test_a_mount_target_in_another_zone_of_the_same_vpc_is_accepted():
    run = run_stack(
        "dev",
        {"modelCacheFileSystemId": FS, **EXISTING_NETWORK},
        model_cache={"mountTargets": [{"vpcId": EXISTING_NETWORK["vpcId"], "availabilityZone": "us-east-1c"}]},
    )
    assert run.error is None, run.error
    assert run.of_type(MOUNT_TARGET)[0].inputs["fileSystemId"] == FS


def test_a_one_zone_file_system_in_another_zone_is_refused_naming_its_zone():
    error = refused("dev", {"availabilityZone": "us-east-1a"}, {"availabilityZoneName": "us-east-1c"})
    assert "One Zone" in error and "availabilityZone us-east-1c" in error


# The stack's own mount target, on every `pulumi up` after the first: its network
# interface carries the stack's efs group, which the lookup finds by the stack's tags.
OWN_EFS_GROUP = "sg-0e1f5000000000001"


@pytest.mark.parametrize(
    "overrides, target",
    [
        ({}, {"vpcId": "vpc-0stack00000000001", "availabilityZone": "us-east-1a"}),
        (EXISTING_NETWORK, {"vpcId": EXISTING_NETWORK["vpcId"], "availabilityZone": "us-east-1b"}),
    ],
)
def test_the_stacks_own_mount_target_does_not_refuse_its_next_pulumi_up(overrides, target):
    """A reused cache has the mount target this stack made on its first `pulumi up`; the
    next one must not take it for another's (in another VPC, or in the nodes' zone)."""
    run = run_stack(
        "dev",
        {"modelCacheFileSystemId": FS, **overrides},
        model_cache={
            "stackEfsGroups": [OWN_EFS_GROUP],
            "mountTargets": [{**target, "securityGroups": [OWN_EFS_GROUP]}],
        },
    )
    assert run.error is None, run.error
    lookups = [args for token, args in run.invokes if token == "aws:ec2/getSecurityGroups:getSecurityGroups"]
    assert lookups and {"name": "tag:vllm-cluster:stack", "values": ["dev"]} in lookups[0]["filters"]


def test_a_mount_target_of_another_stack_in_the_nodes_zone_is_still_refused():
    error = refused(
        "dev",
        EXISTING_NETWORK,
        {
            "stackEfsGroups": [OWN_EFS_GROUP],
            "mountTargets": [
                {"vpcId": EXISTING_NETWORK["vpcId"], "availabilityZone": "us-east-1b", "securityGroups": ["sg-0other"]}
            ],
        },
    )
    assert "one mount target per zone" in error


@pytest.mark.parametrize("overrides", [{"modelCacheFileSystemId": FS}, {"retainModelCache": True}])
def test_a_kept_cache_keeps_its_tls_only_policy_when_the_stack_goes(overrides):
    """Without its policy a file system falls back to EFS's default, which lets any client
    of a mount target in without TLS: a cache that outlives the stack keeps the policy
    (it names only this stack's access points, so it admits nobody until reused)."""
    run = run_stack("dev", overrides)
    assert run.error is None, run.error
    (policy,) = run.of_type(POLICY)
    assert policy.retain_on_delete is True


def test_a_cache_the_stack_deletes_takes_its_policy_with_it():
    (policy,) = run_stack("dev", {"retainModelCache": False}).of_type(POLICY)
    assert policy.retain_on_delete is False


def test_a_cache_others_reach_through_their_own_access_points_is_refused_naming_them():
    """Issue 34, point 2: the stack replaces the file system's policy with one that admits
    clients only through its own access points: another stack's would be locked out."""
    other = {
        "id": "fsap-0aaaaaaaaaaaaaaaa",
        "tags": {"vllm-cluster:project": "vllm-cluster", "vllm-cluster:stack": "team-b"},
    }
    untagged = {"id": "fsap-0bbbbbbbbbbbbbbbb", "tags": {}}
    error = refused("dev", {}, {"accessPoints": [other, untagged]})
    assert "fsap-0aaaaaaaaaaaaaaaa, fsap-0bbbbbbbbbbbbbbbb" in error and "lock them out" in error
    assert "aws efs delete-access-point --access-point-id fsap-0aaaaaaaaaaaaaaaa" in error


def test_the_stacks_own_access_points_do_not_refuse_its_next_pulumi_up():
    own = {
        "id": "fsap-0cccccccccccccccc",
        "tags": {"vllm-cluster:project": "vllm-cluster", "vllm-cluster:stack": "dev"},
    }
    run = run_stack("dev", {"modelCacheFileSystemId": FS}, model_cache={"accessPoints": [own]})
    assert run.error is None, run.error
