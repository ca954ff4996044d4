"""The wheelhouse (the nodes' locked wheels on the shared cache) is writable by one
node only, gang 0's head, which fills it; every other node can read it and nothing
more. Judged as EFS would (tests/efs_authorization.py) over the policies the program
declared for every stack and for three gangs: a node that is compromised cannot
plant or swap the files another node installs from. The model tree (and its warm-up
cache) has the same treatment: gang 0's nodes write it, every other gang only reads it
(issue 33, point 3)."""

import pytest
from efs_authorization import Mount, allowed
from pulumi_mocks import ec2_stack_names, run_stack

ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
PROFILE = "aws:iam/instanceProfile:InstanceProfile"
INSTANCE = "aws:ec2/instance:Instance"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
ACCESS_POINT = "aws:efs/accessPoint:AccessPoint"
FS_POLICY = "aws:efs/fileSystemPolicy:FileSystemPolicy"
READ, WRITE, ROOT = (
    "elasticfilesystem:ClientMount",
    "elasticfilesystem:ClientWrite",
    "elasticfilesystem:ClientRootAccess",
)
MODELS_ACCESS_POINT = "vllm-model-cache-access-point"
WHEELHOUSE_ACCESS_POINT = "vllm-wheelhouse-access-point"
NODE_ROLE = "vllm-node-role"
WRITER_ROLE = "vllm-wheelhouse-writer-role"
# The other gangs' nodes: they read the model tree and the wheelhouse and write neither.
READER_ROLE = "vllm-reader-role"


def arn(run, resource) -> str:
    """The ARN the mock cloud gives a resource (cli/mock_runtime.py MockCloud.new_resource)."""
    return f"arn:aws:{resource.type.split(':')[1].split('/')[0]}/{run.id_of(resource)}"


class Access:
    """The program's declared policies, asked as EFS would be."""

    def __init__(self, run):
        self.run = run
        (file_system,) = run.of_type("aws:efs/fileSystem:FileSystem")
        self.file_system_arn = arn(run, file_system)
        (policy,) = run.of_type(FS_POLICY)
        self.file_system_policy = policy.inputs["policy"]

    def role_arn(self, role_name: str) -> str:
        return arn(self.run, self.run.named(role_name, ROLE))

    def identity_policies(self, role_name: str) -> list[str]:
        role = self.run.named(role_name, ROLE)
        return [p.inputs["policy"] for p in self.run.of_type(ROLE_POLICY) if p.inputs["role"] == self.run.id_of(role)]

    def may(self, action: str, access_point: str, role_name: str | None, tls: bool = True) -> bool:
        point = arn(self.run, self.run.named(access_point, ACCESS_POINT))
        mount = Mount(access_point_arn=point, role_arn=self.role_arn(role_name) if role_name else None, tls=tls)
        policies = self.identity_policies(role_name) if role_name else []
        return allowed(action, mount, self.file_system_arn, self.file_system_policy, policies)


@pytest.fixture(scope="module", params=[*ec2_stack_names(), "prod-3-gangs"])
def run(request):
    stack, overrides = ("prod", {"replicas": 3}) if request.param == "prod-3-gangs" else (request.param, {})
    result = run_stack(stack, overrides)
    assert result.error is None, result.error
    return result


def test_no_node_but_the_writer_can_write_the_wheelhouse_with_or_without_iam(run):
    access = Access(run)
    for role in (NODE_ROLE, None):
        assert access.may(READ, WHEELHOUSE_ACCESS_POINT, role), role
        assert not access.may(WRITE, WHEELHOUSE_ACCESS_POINT, role), role
        assert not access.may(ROOT, WHEELHOUSE_ACCESS_POINT, role), role


def test_the_writer_can_write_the_wheelhouse_when_it_mounts_with_iam(run):
    access = Access(run)
    assert access.may(WRITE, WHEELHOUSE_ACCESS_POINT, WRITER_ROLE)
    assert access.may(WRITE, MODELS_ACCESS_POINT, WRITER_ROLE)


def test_gang_0s_nodes_write_the_model_tree_when_they_mount_with_iam(run):
    access = Access(run)
    for role in (NODE_ROLE, WRITER_ROLE):
        assert access.may(READ, MODELS_ACCESS_POINT, role), role
        assert access.may(WRITE, MODELS_ACCESS_POINT, role), role
        assert not access.may(ROOT, MODELS_ACCESS_POINT, role), role


def test_no_other_node_can_write_the_model_tree_with_or_without_iam(run):
    """Without the `iam` mount option a client is anonymous, and the file system policy
    alone decides: it lets everyone read the model tree and nobody write it."""
    access = Access(run)
    # The reader role exists only where there is another gang (prod-3-gangs).
    readers = [None, *([READER_ROLE] if has_role(run, READER_ROLE) else [])]
    for role in readers:
        assert access.may(READ, MODELS_ACCESS_POINT, role), role
        assert not access.may(WRITE, MODELS_ACCESS_POINT, role), role
        assert not access.may(WRITE, WHEELHOUSE_ACCESS_POINT, role), role
        assert not access.may(ROOT, MODELS_ACCESS_POINT, role), role


def has_role(run, name: str) -> bool:
    return any(role.name == name for role in run.of_type(ROLE))


def test_every_other_gang_has_a_role_that_reads_and_writes_nothing():
    run = run_stack("prod", {"replicas": 3})
    assert run.error is None, run.error
    access = Access(run)
    assert access.may(READ, MODELS_ACCESS_POINT, READER_ROLE)
    assert not access.may(WRITE, MODELS_ACCESS_POINT, READER_ROLE)


def test_nothing_reaches_the_cache_without_tls(run):
    access = Access(run)
    for role in (NODE_ROLE, WRITER_ROLE, None):
        for point in (MODELS_ACCESS_POINT, WHEELHOUSE_ACCESS_POINT):
            assert not access.may(READ, point, role, tls=False), (role, point)


def test_the_wheelhouse_is_a_tree_of_its_own_that_the_model_tree_cannot_reach(run):
    """An access point confines its clients to its root directory: the model tree's
    clients must not see the wheelhouse below their root."""
    models = run.named(MODELS_ACCESS_POINT, ACCESS_POINT).inputs["rootDirectory"]["path"]
    wheelhouse = run.named(WHEELHOUSE_ACCESS_POINT, ACCESS_POINT).inputs["rootDirectory"]["path"]
    assert not (wheelhouse + "/").startswith(models.rstrip("/") + "/")
    assert not (models + "/").startswith(wheelhouse.rstrip("/") + "/")


def profile_named_by(run, reference: str):
    return next(p for p in run.of_type(PROFILE) if reference in (arn(run, p), p.inputs.get("name"), p.name))


def test_gang_0s_head_alone_runs_as_the_writer(run):
    """An instance's own iamInstanceProfile overrides its launch template's."""
    roles = {}
    for instance in run.of_type(INSTANCE):
        if instance.name == "vllm-gateway-host":
            continue
        override = instance.inputs.get("iamInstanceProfile")
        if override:
            profile = profile_named_by(run, override)
        else:
            template = next(t for t in run.of_type(TEMPLATE) if run.id_of(t) == instance.inputs["launchTemplate"]["id"])
            profile = profile_named_by(run, template.inputs["iamInstanceProfile"]["arn"])
        roles[instance.name] = profile.inputs["role"]
    assert roles.pop("vllm-head") == WRITER_ROLE
    # Gang 0's workers write the model tree; every other gang's node only reads it.
    gang_0 = {name: role for name, role in roles.items() if not name.startswith("vllm-gang")}
    others = {name: role for name, role in roles.items() if name.startswith("vllm-gang")}
    assert set(gang_0.values()) <= {NODE_ROLE}
    assert set(others.values()) <= {READER_ROLE}


def test_the_writer_may_do_what_a_node_may_and_write_the_wheelhouse_nothing_more(run):
    attached = {
        role: sorted(a.inputs["policyArn"] for a in run.of_type(ATTACHMENT) if a.inputs["role"] == role)
        for role in (NODE_ROLE, WRITER_ROLE)
    }
    assert attached[NODE_ROLE] == attached[WRITER_ROLE] and all(
        a.endswith("AmazonSSMManagedInstanceCore") for a in attached[NODE_ROLE]
    )
