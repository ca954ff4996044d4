"""The real `__main__.py` under Pulumi's mock runtime, against every stack file in
stacks/: the resource graph must hold each security and placement property the
README promises, whatever the stack."""

import ast
import ipaddress
import json
import re

import pytest
from pulumi_mocks import (
    PROJECT,
    ROOT,
    ProjectConfigError,
    alias_urns,
    ec2_stack_names,
    engine_urn,
    engine_urns,
    run_program,
    run_stack,
    run_stack_recorded,
    stack_config,
)

from components import bootstrap, ports
from components.catalog import CATALOG

STACKS = ec2_stack_names()
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG = "aws:ec2/securityGroup:SecurityGroup"
INSTANCE = "aws:ec2/instance:Instance"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
NODE_IMAGE = "vllm-cluster:index:NodeImage"
SUBNET = "aws:ec2/subnet:Subnet"
WORLD = {"0.0.0.0/0", "::/0"}
GATEWAY_HOST = "vllm-gateway-host"


@pytest.fixture(scope="module", params=STACKS)
def run(request):
    result = run_stack(request.param)
    assert result.error is None, f"stack {request.param}: {result.error}"
    result.stack = request.param
    result.config = stack_config(request.param)
    return result


def cfg(run, key, default=None):
    return run.config.get(f"vllm-cluster:{key}", default)


def group_id(run, role):
    return run.id_of(next(r for r in run.of_type(SG) if r.name == f"vllm-{role}-sg"))


def rules_of(run, type_, role):
    gid = group_id(run, role)
    return [r for r in run.of_type(type_) if r.inputs["securityGroupId"] == gid]


def test_there_are_at_least_three_stacks():
    assert {"dev", "prod"} <= set(STACKS) and len(STACKS) >= 3


def test_prod_is_two_p4d_with_tp8_pp2_and_efa():
    config = stack_config("prod")
    assert config["vllm-cluster:instanceType"] == "p4d.24xlarge" and config["vllm-cluster:nodes"] == 2
    assert (config["vllm-cluster:tensorParallelSize"], config["vllm-cluster:pipelineParallelSize"]) == (8, 2)
    assert any(
        stack_config(s)["vllm-cluster:instanceType"] == "p5.48xlarge" and stack_config(s)["vllm-cluster:nodes"] == 2
        for s in STACKS
    )


@pytest.mark.parametrize("stack", STACKS)
def test_stack_files_hold_no_secret_in_plain_text(stack):
    config = stack_config(stack)
    for key in ("vllm-cluster:hfToken", "vllm-cluster:apiKey"):
        assert key not in config or (isinstance(config[key], dict) and "secure" in config[key]), key
    text = open(f"stacks/Pulumi.{stack}.yaml").read()
    assert not re.search(r"hf_[A-Za-z0-9]{20,}", text)


# --- security groups ------------------------------------------------------------------


def world_rules(run):
    """(rule, ports it opens) for every ingress rule whose peer spans the whole internet."""
    found = []
    for rule in run.of_type(INGRESS):
        cidr = rule.inputs.get("cidrIpv4") or rule.inputs.get("cidrIpv6")
        if cidr is not None and ipaddress.ip_network(cidr).prefixlen == 0:
            if rule.inputs["ipProtocol"] == "-1":
                found.append((rule, range(0, 65536)))
            else:
                found.append((rule, range(rule.inputs["fromPort"], rule.inputs["toPort"] + 1)))
    return found


def test_stacks_admit_no_one_from_the_whole_internet(run):
    assert world_rules(run) == []


@pytest.mark.parametrize("stack", STACKS)
def test_a_public_api_opens_only_https_to_the_world(stack):
    result = run_stack(stack, {"apiAllowedCidrs": ["0.0.0.0/0", "::/0"], "allowPublicApi": True})
    assert result.error is None
    opened = world_rules(result)
    assert len(opened) == 2
    for rule, ports_opened in opened:
        assert list(ports_opened) == [ports.API_HTTPS]
        assert not any(port in ports_opened for port in ports.NEVER_PUBLIC), rule.name


def test_only_the_gateway_admits_outside_addresses(run):
    gateway = group_id(run, "gateway")
    for rule in run.of_type(INGRESS):
        if "cidrIpv4" in rule.inputs or "cidrIpv6" in rule.inputs:
            assert rule.inputs["securityGroupId"] == gateway, rule.name


def test_gateway_admits_api_from_api_cidrs_and_admin_ports_from_admin_cidrs_only(run):
    by_port = {}
    from_groups = []
    for rule in rules_of(run, INGRESS, "gateway"):
        assert rule.inputs["fromPort"] == rule.inputs["toPort"] and rule.inputs["ipProtocol"] == "tcp"
        if "referencedSecurityGroupId" in rule.inputs:
            from_groups.append((rule.inputs["fromPort"], rule.inputs["referencedSecurityGroupId"]))
            continue
        by_port.setdefault(rule.inputs["fromPort"], set()).add(
            rule.inputs.get("cidrIpv4") or rule.inputs.get("cidrIpv6")
        )
    # Inside the VPC, only the head's readiness check calls the API through the gateway,
    # and Ray's dashboards on the heads read Prometheus.
    assert sorted(from_groups) == [
        (ports.API_HTTPS, group_id(run, "nodes")),
        (ports.PROMETHEUS, group_id(run, "nodes")),
    ]
    assert set(by_port) == {ports.API_HTTPS, ports.SSH, ports.DASHBOARD_HTTPS}
    assert by_port[ports.API_HTTPS] == set(cfg(run, "apiAllowedCidrs"))
    assert by_port[ports.SSH] == by_port[ports.DASHBOARD_HTTPS] == set(cfg(run, "adminCidrs"))


def test_nodes_admit_the_gateway_only_on_proxied_ports_scraped_ports_and_ssh(run):
    gateway = group_id(run, "gateway")
    rules = rules_of(run, INGRESS, "nodes")
    assert {r.inputs["fromPort"] for r in rules} == {ports.VLLM_API, ports.RAY_DASHBOARD, ports.RAY_METRICS, ports.SSH}
    assert all(r.inputs["referencedSecurityGroupId"] == gateway for r in rules)
    # The nodes' host firewall admits the gateway on the same ports (SSH it leaves alone).
    assert {r.inputs["fromPort"] for r in rules} - {ports.SSH} == set(bootstrap.firewall_gateway_ports())


def test_the_gateway_scrapes_the_nodes_and_the_nodes_read_prometheus_both_ways_and_nothing_else_does(run):
    """Between two groups a connection needs the sender's egress and the receiver's
    ingress rule: the gateway to every node's Ray metrics, the nodes (Ray's dashboard)
    to Prometheus on the gateway. Neither port admits an address range."""
    gateway, nodes = group_id(run, "gateway"), group_id(run, "nodes")

    def pairs(type_, role, port):
        return [
            r.inputs.get("referencedSecurityGroupId") or r.inputs.get("cidrIpv4") or r.inputs.get("cidrIpv6")
            for r in rules_of(run, type_, role)
            if r.inputs.get("fromPort") == port
        ]

    assert pairs(EGRESS, "gateway", ports.RAY_METRICS) == [nodes]
    assert pairs(INGRESS, "nodes", ports.RAY_METRICS) == [gateway]
    assert pairs(EGRESS, "nodes", ports.PROMETHEUS) == [gateway]
    assert pairs(INGRESS, "gateway", ports.PROMETHEUS) == [nodes]


def test_cluster_group_references_itself_for_all_traffic_both_ways(run):
    cluster = group_id(run, "cluster")
    for type_ in (INGRESS, EGRESS):
        rules = rules_of(run, type_, "cluster")
        assert len(rules) == 1
        assert rules[0].inputs["ipProtocol"] == "-1"
        assert rules[0].inputs["referencedSecurityGroupId"] == cluster


def test_efs_admits_nfs_from_the_cluster_group_only(run):
    rules = rules_of(run, INGRESS, "efs")
    assert [(r.inputs["fromPort"], r.inputs["referencedSecurityGroupId"]) for r in rules] == [
        (ports.NFS, group_id(run, "cluster"))
    ]


def test_every_rule_and_group_says_why_it_exists(run):
    allowed = re.compile(r"^[A-Za-z0-9 ._\-:/()#,@\[\]+=&;{}!$*]+$")  # EC2's description alphabet
    for resource in run.of_type(INGRESS) + run.of_type(EGRESS) + run.of_type(SG):
        description = resource.inputs.get("description", "")
        assert len(description) >= 20, resource.name
        assert len(description) <= 255 and allowed.match(description), (resource.name, description)


# --- storage --------------------------------------------------------------------------


def test_model_cache_is_encrypted_elastic_tls_only_and_in_the_node_subnet(run):
    fs = run.named("vllm-model-cache")
    assert fs.inputs["encrypted"] is True and fs.inputs["throughputMode"] == "elastic"
    assert fs.retain_on_delete == (cfg(run, "retainModelCache", False) is True)
    mount = run.of_type("aws:efs/mountTarget:MountTarget")
    assert len(mount) == 1
    assert mount[0].inputs["subnetId"] == run.id_of(run.named("vllm-private-subnet", SUBNET))
    assert mount[0].inputs["securityGroups"] == [group_id(run, "efs")]
    # The model tree and the wheelhouse (tests/test_wheelhouse_access.py judges who may write which).
    assert sorted(a.name for a in run.of_type("aws:efs/accessPoint:AccessPoint")) == [
        "vllm-model-cache-access-point",
        "vllm-wheelhouse-access-point",
    ]
    policy = json.loads(run.of_type("aws:efs/fileSystemPolicy:FileSystemPolicy")[0].inputs["policy"])
    deny = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert deny and deny[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_retain_model_cache_keeps_the_file_system_on_destroy():
    assert run_stack("dev", {"retainModelCache": True}).named("vllm-model-cache").retain_on_delete is True
    assert run_stack("dev", {"retainModelCache": False}).named("vllm-model-cache").retain_on_delete is False


# --- compute --------------------------------------------------------------------------


def gpu_nodes(run):
    return [r for r in run.of_type(INSTANCE) if r.parent_type == "vllm-cluster:index:GpuNodes"]


def test_head_and_workers_match_nodes(run):
    nodes = gpu_nodes(run)
    assert len(nodes) == cfg(run, "nodes", 1)
    roles = sorted(n.inputs["tags"]["vllm-cluster:role"] for n in nodes)
    assert roles == ["head"] + ["worker"] * (len(nodes) - 1)


def test_gpu_nodes_share_one_subnet_one_template_and_no_public_ip(run):
    templates = run.of_type(TEMPLATE)
    assert len(templates) == 1
    template = templates[0]
    interfaces = template.inputs["networkInterfaces"]
    assert {i["subnetId"] for i in interfaces} == {run.id_of(run.named("vllm-private-subnet", SUBNET))}
    primary = [i for i in interfaces if i["deviceIndex"] == 0 and i["networkCardIndex"] == 0]
    assert len(primary) == 1 and primary[0]["associatePublicIpAddress"] == "false"
    assert not any(i.get("associatePublicIpAddress") == "true" for i in interfaces)
    for node in gpu_nodes(run):
        assert node.inputs["launchTemplate"]["id"] == run.id_of(template)
        assert "subnetId" not in node.inputs and not node.inputs.get("associatePublicIpAddress")


def test_efa_interfaces_match_the_type_and_carry_the_cluster_group(run):
    instance = CATALOG[cfg(run, "instanceType")]
    interfaces = run.of_type(TEMPLATE)[0].inputs["networkInterfaces"]
    efa_on = str(cfg(run, "efa", "auto")) == "true" or (
        str(cfg(run, "efa", "auto")) == "auto" and instance.efa_supported and cfg(run, "nodes", 1) > 1
    )
    efa = [i for i in interfaces if i["interfaceType"] in ("efa", "efa-only")]
    assert len(efa) == (min(instance.max_efa_interfaces, instance.network_cards) if efa_on else 0)
    cluster, nodes = group_id(run, "cluster"), group_id(run, "nodes")
    for interface in interfaces:
        assert cluster in interface["securityGroups"]
        if interface["deviceIndex"] == 0 and interface["networkCardIndex"] == 0:
            assert interface["interfaceType"] == "interface" and nodes in interface["securityGroups"]
        else:
            assert interface["interfaceType"] == "efa-only" and nodes not in interface["securityGroups"]
    assert "vpcSecurityGroupIds" not in run.of_type(TEMPLATE)[0].inputs


def test_one_cluster_placement_group_when_several_nodes_or_efa(run):
    groups = run.of_type("aws:ec2/placementGroup:PlacementGroup")
    template = run.of_type(TEMPLATE)[0]
    if cfg(run, "nodes", 1) > 1 or str(cfg(run, "efa", "auto")) == "true":
        assert len(groups) == 1 and groups[0].inputs["strategy"] == "cluster"
        assert template.inputs["placement"]["groupName"] == groups[0].name
    else:
        assert groups == [] and "placement" not in template.inputs


def test_an_existing_placement_group_is_used_by_name_and_none_is_created(run):
    """A reservation made in a cluster placement group serves only instances launched into it."""
    result = run_stack(run.stack, {**RESERVED, "placementGroupName": "reserved-pg"})
    assert result.error is None
    assert result.of_type("aws:ec2/placementGroup:PlacementGroup") == []
    assert result.of_type(TEMPLATE)[0].inputs["placement"] == {"groupName": "reserved-pg"}


def test_imdsv2_only_and_encrypted_gp3_root(run):
    template = run.of_type(TEMPLATE)[0].inputs
    assert template["metadataOptions"]["httpTokens"] == "required"
    assert template["metadataOptions"]["httpPutResponseHopLimit"] == 1
    ebs = template["blockDeviceMappings"][0]["ebs"]
    assert ebs["encrypted"] == "true" and ebs["volumeType"] == "gp3"
    assert ebs["volumeSize"] == cfg(run, "rootVolumeGiB", 200)
    gateway = run.named(GATEWAY_HOST).inputs
    assert gateway["metadataOptions"]["httpTokens"] == "required"
    assert gateway["rootBlockDevice"]["encrypted"] is True


def test_node_roles_may_open_a_session_and_use_the_model_cache_only(run):
    """Every node's role and the wheelhouse writer's (gang 0's head), as IAM receives them.
    Issue 33 point 5: AmazonSSMManagedInstanceCore let every node read the region's whole
    Parameter Store (ssm:GetParameter(s) on "*"); no managed policy is attached now, and
    SSM is Session Manager's actions alone. The gateway's role, with idleStopMinutes, is
    tests/test_idle_stop.py's."""
    attachments = run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    assert [a for a in attachments if a.parent_type != "vllm-cluster:index:NodeImage"] == []
    node_roles = [r for r in run.of_type("aws:iam/role:Role") if r.parent_type == "vllm-cluster:index:GpuNodes"]
    assert len(node_roles) == 2
    session = {
        "ssm:UpdateInstanceInformation",
        "ssmmessages:CreateControlChannel",
        "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel",
        "ssmmessages:OpenDataChannel",
    }
    granted = {}
    for policy in run.of_type("aws:iam/rolePolicy:RolePolicy"):
        if policy.parent_type != "vllm-cluster:index:GpuNodes":
            continue
        inline = json.loads(policy.inputs["policy"])
        actions = {a for s in inline["Statement"] for a in s["Action"]}
        granted.setdefault(policy.name.rsplit("-role-", 1)[0], []).append(actions)
        if actions == session:
            # Channels of the instance's own sessions: Session Manager names no resource.
            assert [s["Resource"] for s in inline["Statement"]] == ["*"]
        else:
            assert actions == {"elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"}
            assert all(s["Resource"].startswith("arn:aws:efs") for s in inline["Statement"])
    assert sorted(granted) == ["vllm-node", "vllm-wheelhouse-writer"]
    for role, policies in granted.items():
        assert session in policies and len(policies) == 2, role
        assert not any(a.startswith("ssm:Get") for actions in policies for a in actions), role


def test_deep_learning_ami_is_looked_up_unless_set(run):
    amis = [args for token, args in run.invokes if token == "aws:ec2/getAmi:getAmi"]
    names = [f["values"][0] for args in amis for f in args["filters"] if f["name"] == "name"]
    assert any(name.startswith("Deep Learning Base OSS Nvidia Driver GPU AMI") for name in names)
    pinned = run_stack(run.stack, {"amiId": "ami-0123456789abcdef0", "nodeImage": "none"})
    assert pinned.of_type(TEMPLATE)[0].inputs["imageId"] == "ami-0123456789abcdef0"
    # Baked (the default): on the pinned image.
    baked = run_stack(run.stack, {"amiId": "ami-0123456789abcdef0"})
    assert baked.named("vllm-node-image-recipe").inputs["parentImage"] == "ami-0123456789abcdef0"


def test_a_newer_image_does_not_replace_running_nodes_or_the_gateway(run):
    assert "imageId" in run.of_type(TEMPLATE)[0].ignore_changes
    assert "ami" in run.named(GATEWAY_HOST).ignore_changes
    pinned = run_stack(run.stack, {"amiId": "ami-0123456789abcdef0"})
    assert "imageId" not in pinned.of_type(TEMPLATE)[0].ignore_changes  # a pinned AMI change is deliberate


def test_instances_boot_only_after_routes_rules_and_the_mount_target(run):
    """cloud-init downloads and mounts at first boot: a node started before its NAT
    route, its security group rules or the EFS mount target fails its bootstrap."""
    # The node image builder's rules serve its bake, not the nodes.
    rules = {r.urn for r in run.of_type(INGRESS) + run.of_type(EGRESS) if r.parent_type != NODE_IMAGE}
    routes = {
        r.urn
        for r in run.of_type("aws:ec2/route:Route") + run.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")
    }
    mount = {r.urn for r in run.of_type("aws:efs/mountTarget:MountTarget")}
    for node in gpu_nodes(run):
        assert rules | routes | mount <= set(node.dependencies), node.name
    assert rules | routes <= set(run.named(GATEWAY_HOST).dependencies)


# A reservation serves one zone: the config names it (the spec refuses one without it).
# It is paid whether its nodes run or not: the spec refuses idle stop with it (dev sets it).
RESERVED = {"capacityReservationId": "cr-0123456789abcdef0", "availabilityZone": "us-east-1b", "idleStopMinutes": None}
RESERVED_BLOCK = {**RESERVED, "capacityBlock": True}


def test_gpu_nodes_launch_into_a_configured_capacity_reservation_or_block(run):
    assert "capacityReservationSpecification" not in run.of_type(TEMPLATE)[0].inputs
    reserved = run_stack(run.stack, RESERVED_BLOCK)
    target = reserved.of_type(TEMPLATE)[0].inputs["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target["capacityReservationId"] == "cr-0123456789abcdef0"
    assert all(n.inputs["instanceMarketOptions"]["marketType"] == "capacity-block" for n in gpu_nodes(reserved))
    assert "instanceMarketOptions" not in reserved.named(GATEWAY_HOST).inputs


def test_reserved_gpu_nodes_are_replaced_delete_first_and_the_preview_says_so(run):
    """A launch-template change replaces every GPU node; a full reservation has no slot
    for a new node beside the old one, so with a reservation the old one goes first."""
    reserved = run_stack(run.stack, RESERVED)
    assert reserved.error is None
    assert gpu_nodes(reserved) and all(node.delete_before_replace for node in gpu_nodes(reserved))
    assert not reserved.named(GATEWAY_HOST).delete_before_replace
    assert any(
        "cr-0123456789abcdef0" in w and "stops" in w and "before its replacement" in w for w in reserved.warnings
    )


def test_unreserved_gpu_nodes_keep_the_default_create_first_replacement(run):
    assert not any(node.delete_before_replace for node in gpu_nodes(run))
    assert not any("reservation" in w for w in run.warnings)


def test_gateway_is_public_with_an_elastic_ip(run):
    gateway = run.named(GATEWAY_HOST)
    assert gateway.inputs["subnetId"] == run.id_of(run.named("vllm-public-subnet", SUBNET))
    assert gateway.inputs["vpcSecurityGroupIds"] == [group_id(run, "gateway")]
    eips = [e for e in run.of_type("aws:ec2/eip:Eip") if e.parent_type == "vllm-cluster:index:Gateway"]
    assert len(eips) == 1 and eips[0].inputs["instance"] == run.id_of(gateway)


def test_network_is_one_zone_with_public_and_private_subnets_and_a_nat(run):
    subnets = run.of_type("aws:ec2/subnet:Subnet")
    assert len(subnets) == 2 and len({s.inputs["availabilityZone"] for s in subnets}) == 1
    assert not any(s.inputs.get("mapPublicIpOnLaunch") for s in subnets)
    routes = {r.name: r.inputs for r in run.of_type("aws:ec2/route:Route")}
    assert "gatewayId" in routes["vllm-public-default-route"] and "natGatewayId" in routes["vllm-private-default-route"]
    assert len(run.of_type("aws:ec2/natGateway:NatGateway")) == 1


EXISTING = {
    "vpcId": "vpc-0123456789abcdef0",
    "publicSubnetId": "subnet-0aaaaaaaaaaaaaaaa",
    "privateSubnetId": "subnet-0bbbbbbbbbbbbbbbb",
}


def test_existing_network_is_used_instead_of_a_new_one():
    result = run_stack("prod", EXISTING)
    assert result.error is None
    assert result.of_type("aws:ec2/vpc:Vpc") == [] and result.of_type("aws:ec2/subnet:Subnet") == []
    assert {i["subnetId"] for i in result.of_type(TEMPLATE)[0].inputs["networkInterfaces"]} == {
        "subnet-0bbbbbbbbbbbbbbbb"
    }
    assert result.named(GATEWAY_HOST).inputs["subnetId"] == "subnet-0aaaaaaaaaaaaaaaa"


@pytest.mark.parametrize("attribute", ["enableDnsHostnames", "enableDnsSupport"])
def test_an_existing_vpc_without_dns_declares_nothing_and_names_the_key(attribute):
    """The EFS mount target is reached by its DNS name, which such a VPC never resolves."""
    result = run_stack("prod", EXISTING, existing_vpc={attribute: False})
    assert type(result.error).__name__ == "RunError" and result.resources == []
    assert "vllm-cluster:vpcId" in str(result.error) and attribute in str(result.error)
    assert ("aws:ec2/getVpc:getVpc", {"id": EXISTING["vpcId"]}) in [
        (token, {k: v for k, v in args.items() if v is not None}) for token, args in result.invokes
    ]


# --- graph-wide properties ---------------------------------------------------------------


def test_every_resource_is_parented_by_a_component(run):
    components = {r.urn for r in run.resources if r.type.startswith("vllm-cluster:index:")}
    assert len(components) == 9  # the node image's among them: no stack finds one baked in the mock cloud
    for resource in run.resources:
        if resource.type.startswith("vllm-cluster:index:"):
            assert resource.parent_type == "pulumi:pulumi:Stack"
        else:
            assert resource.parent in components, f"{resource.type} {resource.name} has parent {resource.parent}"


def test_every_taggable_resource_is_tagged_with_the_stack(run):
    for resource in run.resources:
        if "tags" in resource.inputs:
            assert resource.inputs["tags"]["vllm-cluster:stack"] == run.stack


def test_resource_names_are_identical_across_two_runs(run):
    again = run_stack(run.stack)
    # Registration order is the SDK's business; the set of (type, name) pairs is what Pulumi diffs.
    assert sorted((r.type, r.name) for r in again.resources) == sorted((r.type, r.name) for r in run.resources)
    assert len({(r.type, r.name) for r in run.resources}) == len(run.resources)


def component_classes():
    """(type token, class name, {attribute: annotation}, public attributes it assigns)
    of every ComponentResource in components/, read from the source."""
    for path in sorted((ROOT / "components").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not (isinstance(node, ast.ClassDef) and "pulumi.ComponentResource" in map(ast.unparse, node.bases)):
                continue
            annotations = {
                item.target.id: ast.unparse(item.annotation)
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
            assigned = {
                item.attr
                for item in ast.walk(node)
                if isinstance(item, ast.Attribute)
                and isinstance(item.ctx, ast.Store)
                and ast.unparse(item.value) == "self"
                and not item.attr.startswith("_")
            }
            token = next(
                call.args[0].value
                for call in ast.walk(node)
                if isinstance(call, ast.Call) and ast.unparse(call.func) == "super().__init__"
            )
            yield token, node.name, annotations, assigned


def camel(attribute: str) -> str:
    first, *rest = attribute.split("_")
    return first + "".join(word.capitalize() for word in rest)


def test_components_declare_every_attribute_they_set():
    classes = list(component_classes())
    assert len(classes) == 10
    for _, name, annotations, assigned in classes:
        assert assigned <= set(annotations), f"{name} sets undeclared {sorted(assigned - set(annotations))}"


def test_components_register_every_value_they_expose(recorded_runs):
    """What another component or the stack reads from a component is in its registered
    outputs, so `pulumi stack` shows it; resource handles (instances, rules) kept only
    to wait for are not values."""
    for stack, (run, recorded) in recorded_runs.items():
        registered = {component_type: keys for (component_type, _), keys in recorded.outputs.items()}
        declared = {resource.type for resource in run.resources}
        for token, name, annotations, _ in component_classes():
            if token not in declared:
                continue  # a component of the other kind of stack (EC2 instances or hosts)
            values = {
                camel(a)
                for a, annotation in annotations.items()
                if re.search(r"\b(Output|Input)\[", annotation) or annotation in ("bool", "int", "str")
            }
            assert values, name
            assert values <= registered.get(token, set()), (
                f"{stack}: {name} does not register {sorted(values - registered.get(token, set()))}"
            )


# --- exports --------------------------------------------------------------------------


EXPORTS = {
    "endpoint",
    "dashboardUrl",
    "gatewayPublicIp",
    "headPrivateIp",
    "workerPrivateIps",
    "sshCommand",
    "apiKey",
    "modelCacheFileSystemId",
    "topology",
    "metricsUrl",
    "metricsLogin",
}


def test_exports_are_present_and_secrets_are_secret(run):
    assert EXPORTS <= set(run.outputs)
    assert {"apiKey", "sshPrivateKey", "metricsLogin"} <= run.secret_outputs
    assert run.outputs["metricsUrl"] == f"https://{run.outputs['gatewayPublicIp']}:{ports.DASHBOARD_HTTPS}/prometheus/"
    user, password = run.outputs["metricsLogin"].split(":")
    assert user == "metrics" and len(password) >= 32
    assert run.outputs["endpoint"] == f"https://{run.outputs['gatewayPublicIp']}/v1"
    assert run.outputs["dashboardUrl"].startswith(f"https://{run.outputs['gatewayPublicIp']}:")
    assert len(run.outputs["workerPrivateIps"]) == cfg(run, "nodes", 1) - 1
    assert run.outputs["headPrivateIp"] in run.outputs["sshCommand"]
    assert run.outputs["modelCacheFileSystemId"].startswith("fs-")


def test_no_secret_value_appears_in_a_plain_output(run):
    secrets = [run.outputs["apiKey"], run.outputs["sshPrivateKey"], run.outputs["metricsLogin"].split(":")[1]]
    for key, value in run.outputs.items():
        if key not in run.secret_outputs:
            assert not any(secret in json.dumps(value) for secret in secrets), key


def test_topology_export_keeps_tp_groups_inside_nodes(run):
    topology = run.outputs["topology"]
    tp, pp = topology["tensorParallelSize"], topology["pipelineParallelSize"]
    assert len(topology["nodes"]) == cfg(run, "nodes", 1) and topology["nodes"][0]["role"] == "head"
    for stage in range(pp):
        assert len({r["node"] for r in topology["ranks"] if r["ppRank"] == stage}) == 1
    assert len(topology["ranks"]) == tp * pp


def test_a_configured_api_key_is_exported_as_a_secret_and_not_generated():
    key = "k" * 40
    result = run_stack("dev", {"apiKey": key}, secret_keys=["apiKey"])
    assert result.outputs["apiKey"] == key and "apiKey" in result.secret_outputs
    generated = [r.name for r in result.of_type("random:index/randomPassword:RandomPassword")]
    assert "vllm-api-key" not in generated and "vllm-ray-token" in generated


# --- bad config -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"nodes": 0}, "nodes"),
        ({"adminCidrs": ["0.0.0.0/0"]}, "adminCidrs"),
        ({"model": "org/m;reboot"}, "model"),
        ({"instanceType": "p9.mega"}, "instanceType"),
        ({"tensorParallelSize": 16}, "tensorParallelSize"),
    ],
)
def test_a_bad_config_declares_no_resource(changes, key):
    result = run_stack("prod", changes)
    assert result.error is not None and f"vllm-cluster:{key}" in str(result.error)
    assert type(result.error).__name__ == "RunError"
    assert result.resources == []


def test_the_cli_refuses_a_stack_without_the_required_keys():
    with pytest.raises(ProjectConfigError, match="model"):
        run_program(
            {
                "vllm-cluster:instanceType": "g6.xlarge",
                "vllm-cluster:apiAllowedCidrs": ["203.0.113.0/24"],
                "vllm-cluster:adminCidrs": ["198.51.100.7/32"],
            }
        )


def test_a_misspelt_key_is_reported_not_ignored():
    result = run_stack("dev", {"instancetype": "g5.xlarge"})
    assert "did you mean instanceType" in str(result.error) and result.resources == []


def test_several_nodes_without_efa_warns():
    result = run_stack("prod", {"efa": "false"})
    assert result.error is None
    assert any("without EFA" in w for w in result.warnings)


# --- the identity of deployed resources ---------------------------------------------------


def deployed_urns(stack: str) -> set[str]:
    """tests/golden/urns-<stack>.txt: the URNs in the state of a stack deployed before issue 12."""
    text = (ROOT / "tests" / "golden" / f"urns-{stack}.txt").read_text()
    return {line for line in text.splitlines() if line and not line.startswith("#")}


@pytest.fixture(scope="module")
def recorded_runs():
    """Every stack run once with its aliases and registered outputs recorded."""
    runs = {}
    for stack in STACKS:
        run, recorded = run_stack_recorded(stack)
        assert run.error is None, f"stack {stack}: {run.error}"
        runs[stack] = (run, recorded)
    return runs


# Resources added on purpose since those stacks were deployed: their next `pulumi up`
# creates these, and nothing else.
# Deployed resources a later version removes on purpose (`pulumi up` deletes them): name -> why.
REMOVED_SINCE_DEPLOYED = {
    # Issue 33 point 5: the node role's AmazonSSMManagedInstanceCore let every node read the
    # region's Parameter Store; an inline policy of Session Manager's actions replaces it.
    "vllm-ssm": "AmazonSSMManagedInstanceCore attachment",
}
ADDED_SINCE_DEPLOYED = {
    # Issue 19: the wheelhouse, writable by gang 0's head alone (tests/test_wheelhouse_access.py).
    "vllm-wheelhouse-access-point",
    "vllm-wheelhouse-writer-role",
    "vllm-wheelhouse-writer-role-session-manager",
    "vllm-wheelhouse-writer-role-model-cache",
    "vllm-wheelhouse-writer-instance-profile",
    # Issue 20: the model's first download split over gang 0's nodes, each node's stage on
    # its own disk with vLLM's compile cache seeded, and that cache kept after it served.
    *(f"vllm-model-part-worker-{i}" for i in range(1, 16)),
    *(
        f"vllm-{step}-{node}"
        for step in ("prepare", "warmup")
        for node in ("head", *(f"worker-{i}" for i in range(1, 16)))
    ),
    # Issue 21: Prometheus on the gateway scrapes the nodes; Ray's dashboards read it;
    # its metrics login.
    "vllm-gateway-prometheus-from-nodes",
    "vllm-gateway-to-ray-metrics",
    "vllm-nodes-ray-metrics-from-gateway",
    "vllm-nodes-to-prometheus",
    "vllm-gateway-metrics",
    "vllm-metrics-password",
    # Issue 23: with idleStopMinutes (the dev stack sets it), the gateway's role that may
    # start the stack's stopped GPU instances, its waker, and each node's idle timer.
    "vllm-gateway-role",
    "vllm-gateway-role-wake",
    "vllm-gateway-instance-profile",
    "vllm-gateway-waker",
    *(f"vllm-idle-stop-{node}" for node in ("head", *(f"worker-{i}" for i in range(1, 16)))),
    # Issue 33: the gateway checks the API keys itself (installed by their own command);
    # the heads' vLLM checks a key of its own, and each head has a probe key for the gateway.
    "vllm-gateway-api-keys",
    "vllm-heads-api-key",
    "vllm-probe-api-key",
    # Issue 33, point 4: every host's SSH host key, generated by the stack, delivered in
    # its user data and pinned by every connection.
    "vllm-gateway-host-key",
    *(f"vllm-{node}-host-key" for node in ("head", *(f"worker-{i}" for i in range(1, 16)))),
    # Issue 33 point 5: Session Manager's actions alone in place of AmazonSSMManagedInstanceCore,
    # and the stack's random id the gateway's role may start instances by.
    "vllm-node-role-session-manager",
    "vllm-stack-id",
    # Issue 35 point 1: the node image, baked by Image Builder (components/node_image.py).
    *(
        f"vllm-node-image{part}"
        for part in (
            "",
            "-bucket",
            "-bucket-private",
            "-bake-script",
            "-builder-role",
            "-builder-image-builder",
            "-builder-policy",
            "-builder-profile",
            "-builder-sg",
            "-builder-out-443",
            "-builder-out-80",
            "-component",
            "-recipe",
            "-infrastructure",
            "-image",
        )
    ),
    # Issue 35 point 4: the fabric gate, each node's share of the gang's all-reduce and the
    # head's judgement of it (gangs of several nodes).
    "vllm-fabric",
    *(f"vllm-fabric-{node}" for node in ("head", *(f"worker-{i}" for i in range(1, 16)))),
}


@pytest.mark.parametrize("stack", STACKS)
def test_every_deployed_resource_is_still_declared_under_its_urn_or_an_alias(stack, recorded_runs):
    """The engine matches a declared resource to the state by URN, then by alias: a
    deployed URN that nothing claims is deleted, and a declaration that claims none is
    created. Either would replace a live resource (a GPU node, the model cache). A
    component's type is in its URN and its children's, so this holds the types too."""
    run, recorded = recorded_runs[stack]
    identities = {urn: {urn, *aliases} for urn, aliases in alias_urns(run, recorded, stack).items()}
    deployed = deployed_urns(stack)
    for old in sorted(deployed):
        claimed_by = [urn for urn, names in identities.items() if old in names]
        if old.rsplit("::", 1)[1] in REMOVED_SINCE_DEPLOYED:
            assert claimed_by == [], f"{old} is listed as removed but is still declared"
            continue
        assert len(claimed_by) == 1, f"{old} is claimed by {claimed_by or 'nothing'}"
    for urn, names in identities.items():
        if urn.rsplit("::", 1)[1] in ADDED_SINCE_DEPLOYED:
            assert not names & deployed, f"{urn} is listed as new but was deployed"
            continue
        assert names & deployed, f"{urn} matches nothing deployed: `pulumi up` would create it"


def sdk_type_alias(urn: str, alias: str) -> bool:
    """An alias the provider's SDK itself gives every resource of a type it renamed (pulumi-aws's
    s3.Bucket carries aws:s3/bucketV2:BucketV2): the same name under a former type, no rename
    of ours."""
    return alias.rsplit("::", 1)[1] == urn.rsplit("::", 1)[1] and alias.rsplit("::", 2)[0] == urn.rsplit("::", 2)[0]


# Issue 12 named every resource by what it is: (type, new name) -> the name deployed stacks know.
RENAMED = {
    (INSTANCE, "vllm-gateway-host"): "vllm-host",
    ("aws:ec2/eip:Eip", "vllm-gateway-ip"): "vllm-ip",
    ("aws:ec2/placementGroup:PlacementGroup", "vllm-node-placement-group"): "vllm-placement",
    ("aws:iam/role:Role", "vllm-node-role"): "vllm-role",
    ("aws:iam/rolePolicy:RolePolicy", "vllm-node-role-model-cache"): "vllm-model-cache",
    ("aws:iam/instanceProfile:InstanceProfile", "vllm-node-instance-profile"): "vllm-profile",
    (SUBNET, "vllm-public-subnet"): "vllm-public",
    (SUBNET, "vllm-private-subnet"): "vllm-private",
    ("aws:ec2/internetGateway:InternetGateway", "vllm-internet-gateway"): "vllm-igw",
    ("aws:ec2/natGateway:NatGateway", "vllm-nat-gateway"): "vllm-nat",
    ("aws:ec2/routeTable:RouteTable", "vllm-public-route-table"): "vllm-public",
    ("aws:ec2/routeTable:RouteTable", "vllm-private-route-table"): "vllm-private",
    ("aws:ec2/route:Route", "vllm-public-default-route"): "vllm-public-default",
    ("aws:ec2/route:Route", "vllm-private-default-route"): "vllm-private-default",
    ("aws:ec2/routeTableAssociation:RouteTableAssociation", "vllm-public-route-table-association"): "vllm-public",
    ("aws:ec2/routeTableAssociation:RouteTableAssociation", "vllm-private-route-table-association"): "vllm-private",
    (SG, "vllm-gateway-sg"): "vllm-gateway",
    (SG, "vllm-nodes-sg"): "vllm-nodes",
    (SG, "vllm-cluster-sg"): "vllm-cluster",
    (SG, "vllm-efs-sg"): "vllm-efs",
    ("aws:efs/fileSystem:FileSystem", "vllm-model-cache"): "vllm-fs",
    ("aws:efs/mountTarget:MountTarget", "vllm-model-cache-mount"): "vllm-mount",
    ("aws:efs/accessPoint:AccessPoint", "vllm-model-cache-access-point"): "vllm-models",
    ("aws:efs/fileSystemPolicy:FileSystemPolicy", "vllm-model-cache-tls-only"): "vllm-tls-only",
    ("tls:index/privateKey:PrivateKey", "vllm-gateway-tls-key"): "vllm-tls",
    ("tls:index/selfSignedCert:SelfSignedCert", "vllm-gateway-tls-certificate"): "vllm-tls",
}


def test_each_renamed_resource_is_aliased_to_its_old_urn_and_nothing_else_is_aliased(recorded_runs):
    seen = set()
    for stack, (run, recorded) in recorded_runs.items():
        engine, aliases = engine_urns(run, stack), alias_urns(run, recorded, stack)
        for resource in run.resources:
            urn = engine[resource.urn]
            old_name = RENAMED.get((resource.type, resource.name))
            if old_name is None:
                ours = [alias for alias in aliases[urn] if not sdk_type_alias(urn, alias)]
                assert ours == [], f"{urn} carries aliases {ours} but is not in RENAMED"
                continue
            old_urn = engine_urn(stack, PROJECT, engine.get(resource.parent), resource.type, old_name)
            assert aliases[urn] == [old_urn], urn
            assert old_urn in deployed_urns(stack), f"{old_urn} was never deployed: RENAMED is wrong"
            seen.add((resource.type, resource.name))
    assert seen == set(RENAMED), f"RENAMED names resources no stack declares: {set(RENAMED) - seen}"
