"""vllm-cluster: a multi-node vLLM inference service on AWS.

Reads the stack's config once into a validated spec (nothing is declared when it
is bad), builds the components and exports what users need to reach the service.
The services run on the EC2 instances the stack creates, or on machines the user
already has (config hosts: then nothing is created on AWS, components/own_hosts.py).
"""

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components import (
    bootstrap,
    fabric,
    gateway_capacity,
    host_keys,
    idle_stop,
    metrics,
    node_env,
    node_image,
    ports,
    quotas,
    sizing,
)
from components.certificate import GatewayCertificate, GatewayCertificateArgs
from components.compute import GpuNodes, GpuNodesArgs, NodeBootArgs, node_image_query
from components.credentials import Credentials, CredentialsArgs
from components.engine_capacity import spec_gang_max_num_seqs
from components.gateway import GATEWAY_ROOT_GIB, Gateway, GatewayArgs
from components.network import Network, NetworkArgs, first_zone
from components.own_hosts import OwnHosts, OwnHostsArgs
from components.security import SecurityArgs, SecurityGroups
from components.services import ClusterServices, vllm_settings
from components.services_args import (
    GatewayServiceArgs,
    IdleStopArgs,
    ModelServingArgs,
    NodesArgs,
    ServicesArgs,
    ServingGang,
)
from components.spec import (
    CONFIG_KEYS,
    MIN_ROOT_VOLUME_GIB,
    NAMESPACE,
    NODE_IMAGE_BAKE,
    NODE_IMAGE_NONE,
    ExistingMountTarget,
    SpecError,
    existing_vpc_problems,
    load_spec,
    model_cache_problems,
    model_cache_sharing_problems,
)
from components.stage_volume import stage_volume_for
from components.storage import ExistingFileSystem, ModelStorage, ModelStorageArgs
from components.tagging import stack_tags
from components.topology import efa_interface_count, interface_layout, node_name, topology_summary


def secret_config_keys() -> set[str]:
    """Which `vllm-cluster:*` keys the stack holds encrypted (set with --secret).
    The language host names them in PULUMI_CONFIG_SECRET_KEYS; the mock runtime
    answers is_config_secret."""
    prefix = f"{NAMESPACE}:"
    from_env = {key[len(prefix) :] for key in pulumi.runtime.get_config_secret_keys_env() if key.startswith(prefix)}
    in_process = {key.name for key in CONFIG_KEYS if pulumi.runtime.is_config_secret(prefix + key.name)}
    return from_env | in_process


def read_stack_config() -> dict:
    """Every `vllm-cluster:*` value of the stack, namespace stripped. Read as a whole
    (not key by key) so that a misspelt key is reported instead of ignored. The
    language host passes config in PULUMI_CONFIG; the mock runtime sets it in-process."""
    values = {**pulumi.runtime.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    prefix = f"{NAMESPACE}:"
    return {key[len(prefix) :]: value for key, value in values.items() if key.startswith(prefix)}


try:
    spec = load_spec(
        read_stack_config(),
        stack=pulumi.get_stack(),
        region=pulumi.Config("aws").get("region"),
        secret_keys=secret_config_keys(),
    )
except SpecError as error:
    # RunError: a clean message, no traceback, and no resource declared.
    raise pulumi.RunError(str(error)) from None


# Every resource's name starts with it (components/tagging.py).
name = "vllm"


def check_existing_vpc() -> None:
    """An existing VPC must resolve the EFS DNS name. It takes a lookup, so it runs here,
    before any resource is declared, and fails the way a bad config does."""
    if spec.existing_network is None:
        return
    vpc = aws.ec2.get_vpc(id=spec.existing_network.vpc_id)
    problems = existing_vpc_problems(
        spec.existing_network.vpc_id, bool(vpc.enable_dns_support), bool(vpc.enable_dns_hostnames)
    )
    if problems:
        raise pulumi.RunError(str(SpecError(problems)))


if spec.own_hosts is None:
    check_existing_vpc()


def check_vcpu_quotas() -> None:
    """The account's On-Demand vCPU quotas in the region (Service Quotas) against what the
    stack runs, before any resource is declared: a stack its quota cannot hold is refused
    as a bad config is, instead of failing at the instances once the network, the cache and
    the gateway exist (components/quotas.py). A quota that cannot be read (the deployer may
    lack servicequotas:GetServiceQuota) is said, and the stack goes on without the check."""
    region = pulumi.Config("aws").get("region") or "the stack's region"
    needs, uncounted = quotas.needs(spec.instance_type, spec.total_nodes, spec.gateway_instance_type)
    for what in uncounted:
        pulumi.log.warn(f"vCPU quotas: {what}: not checked before the instances are created")
    limits = {}
    for need in needs:
        try:
            found = aws.servicequotas.get_service_quota(service_code=quotas.SERVICE_CODE, quota_code=need.quota.code)
        except Exception as error:  # an invoke's failure comes as a bare Exception; said, not hidden
            pulumi.log.warn(
                f"vCPU quotas: could not read '{need.quota.name}' ({need.quota.code}): {error}. The stack needs "
                f"{need.vcpus} vCPUs of it; EC2 refuses instances beyond it with VcpuLimitExceeded. Fix: let the "
                "deployer call servicequotas:GetServiceQuota, or check the quota in the Service Quotas console"
            )
            continue
        limits[need.quota.code] = found.value
    refusals, warnings = quotas.judge(needs, limits, region)
    for warning in warnings:
        pulumi.log.warn(warning)
    if refusals:
        raise pulumi.RunError("vCPU quotas: " + "\n".join(refusals))


if spec.own_hosts is None:
    check_vcpu_quotas()


def stack_vpc_and_zone() -> tuple[str | None, str]:
    """The VPC (None: the one the stack creates) and zone the nodes run in, as plain values:
    the private subnet's, else availabilityZone, else the first zone that offers the type
    (network.first_zone, as the Network component picks it)."""
    if spec.existing_network is not None:
        subnet = aws.ec2.get_subnet(id=spec.existing_network.private_subnet_id)
        return spec.existing_network.vpc_id, subnet.availability_zone
    if spec.availability_zone is not None:
        return None, spec.availability_zone
    offerings = aws.ec2.get_instance_type_offerings(
        location_type="availability-zone", filters=[{"name": "instance-type", "values": [spec.instance_type]}]
    )
    return None, first_zone(spec.instance_type, offerings.locations)


def check_model_cache() -> ExistingFileSystem | None:
    """modelCacheFileSystemId: the file system and its mount targets, looked up before any
    resource is declared; one the stack's mount target could not join fails as a bad config
    does. EFS names each mount target's network interface "EFS mount target for fs-... (fsmt-...)"
    (the CreateNetworkInterface event in the EFS User Guide's CloudTrail page,
    https://docs.aws.amazon.com/efs/latest/ug/logging-using-cloudtrail.html): pulumi-aws's
    getMountTarget answers only for a file system with exactly one, so they are found by it."""
    file_system_id = spec.model_cache_file_system_id
    if file_system_id is None:
        return None
    file_system = aws.efs.get_file_system(file_system_id=file_system_id)
    interfaces = aws.ec2.get_network_interfaces(
        filters=[{"name": "description", "values": [f"EFS mount target for {file_system_id} (*"]}]
    )
    # The stack's own mount target (from its first `pulumi up`) carries its efs group, which
    # the stack's tags find (components/tagging.py; EC2 filters by tag:KEY,
    # https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSecurityGroups.html).
    own_groups = set(
        aws.ec2.get_security_groups(
            filters=[
                {"name": "tag:vllm-cluster:project", "values": [pulumi.get_project()]},
                {"name": "tag:vllm-cluster:stack", "values": [pulumi.get_stack()]},
                {"name": "tag:Name", "values": [f"{name}-efs-sg"]},
            ]
        ).ids
    )
    mount_targets = []
    for interface_id in sorted(interfaces.ids):
        interface = aws.ec2.get_network_interface(id=interface_id)
        mount_target_id = interface.description.rsplit("(", 1)[-1].rstrip(")")
        own = bool(own_groups & set(interface.security_groups))
        mount_targets.append(
            ExistingMountTarget(mount_target_id, interface.vpc_id, interface.availability_zone, own=own)
        )
    vpc_id, zone = stack_vpc_and_zone()
    problems = model_cache_problems(
        file_system_id, file_system.availability_zone_name or None, mount_targets, vpc_id, zone
    )
    # Access points of others on it: the stack's policy would lock their clients out. The
    # stack's own (from its first `pulumi up`) carry its tags (components/tagging.py).
    own_tags = stack_tags()
    foreign = [
        point_id
        for point_id in aws.efs.get_access_points(file_system_id=file_system_id).ids
        if any((aws.efs.get_access_point(access_point_id=point_id).tags or {}).get(k) != v for k, v in own_tags.items())
    ]
    problems += model_cache_sharing_problems(file_system_id, foreign)
    if problems:
        raise pulumi.RunError(str(SpecError(problems)))
    return ExistingFileSystem(file_system_id, file_system.arn, file_system.dns_name)


existing_model_cache = check_model_cache() if spec.own_hosts is None else None


def check_account_counts() -> None:
    """What the stack adds to the account's Elastic IPs, VPCs and NAT gateways against their
    quotas (components/quotas.py), counting what the account holds outside this stack: the
    stack's own (found by its tags, on a later `pulumi up`) are not counted twice. A warning,
    not a refusal: the account may free some before the resources are created."""
    adds = quotas.stack_adds(creates_network=spec.existing_network is None)
    region = pulumi.Config("aws").get("region") or "the stack's region"
    own = stack_tags()
    others, where = {}, {}
    if quotas.ELASTIC_IPS in adds:
        others[quotas.ELASTIC_IPS.code] = len(aws.ec2.get_eips().allocation_ids) - len(
            aws.ec2.get_eips(tags=own).allocation_ids
        )
        where[quotas.ELASTIC_IPS.code] = f"in {region}"
    if quotas.VPCS in adds:
        others[quotas.VPCS.code] = len(aws.ec2.get_vpcs().ids) - len(aws.ec2.get_vpcs(tags=own).ids)
        where[quotas.VPCS.code] = f"in {region}"
    if quotas.NAT_GATEWAYS in adds:
        _, zone = stack_vpc_and_zone()
        where[quotas.NAT_GATEWAYS.code] = f"in {zone}"
        subnets = aws.ec2.get_subnets(filters=[{"name": "availability-zone", "values": [zone]}]).ids
        # Pending and deleting NAT gateways count against the quota too.
        in_zone = [
            {"name": "subnet-id", "values": sorted(subnets)},
            {"name": "state", "values": ["pending", "available", "deleting"]},
        ]
        others[quotas.NAT_GATEWAYS.code] = (
            len(aws.ec2.get_nat_gateways(filters=in_zone).ids)
            - len(aws.ec2.get_nat_gateways(filters=in_zone, tags=own).ids)
            if subnets
            else 0
        )
    limits = {}
    for quota in adds:
        try:
            limits[quota.code] = aws.servicequotas.get_service_quota(
                service_code=quota.service_code, quota_code=quota.code
            ).value
        except Exception:  # noqa: BLE001 unreadable (no servicequotas permission): the default is judged, as said
            limits[quota.code] = quota.default
    for warning in quotas.count_warnings(adds, others, limits, where):
        pulumi.log.warn(warning)


if spec.own_hosts is None:
    check_account_counts()


@dataclass(frozen=True)
class BakedImage:
    """nodeImage bake: what the image holds (its key), the account's image baked for it
    if there is one, and the base image's root device."""

    key: node_image.ImageKey
    found_id: str | None
    root_device_name: str


def find_baked_image() -> BakedImage | None:
    """The account's own image baked for this lock and base image (components/node_image.py),
    looked up before any resource is declared: found, the nodes launch from it and nothing is
    built; absent, the stack bakes it. None when the stack does not bake (nodeImage)."""
    if spec.own_hosts is not None or not spec.bakes_node_image:
        return None
    base = aws.ec2.get_ami(**node_image_query(spec.ami_id))
    key = node_image.image_key((node_env.ROOT / spec.node_lock).read_text(), base.id)
    # Newest first (DescribeImages by creation date): two stacks that baked at once made two.
    found = aws.ec2.get_ami_ids(owners=["self"], filters=node_image.baked_image_filters(key))
    return BakedImage(key, found.ids[0] if found.ids else None, base.root_device_name)


baked_image = find_baked_image()

for warning in spec.warnings:
    pulumi.log.warn(warning)

credentials = Credentials(
    name,
    CredentialsArgs(
        api_key=spec.api_key,
        previous_api_key=spec.previous_api_key,
        gang_count=spec.declared_gangs,
        ssh_private_key=spec.own_hosts.ssh_private_key if spec.own_hosts is not None else None,
    ),
)


@dataclass
class Machines:
    """Where the services run: the EC2 instances the stack creates, or the machines the
    user already has (hosts). The services and the outputs take them from here alone."""

    gateway_public_address: pulumi.Input[str]
    gateway_private_ip: pulumi.Input[str]
    # The gateway's commands start after these (and run again when they are replaced).
    gateway: list[pulumi.Resource]
    # Per gang: its nodes' private IPs, the resource each node's commands start after, and
    # each node's SSH host key (components/host_keys.py), head first.
    gangs: list[tuple[list[pulumi.Input[str]], list[pulumi.Resource], list[pulumi.Input[str]]]]
    # The gateway's SSH host key: every connection to it, and through it, pins it.
    gateway_host_key: pulumi.Input[str]
    node_boot: NodeBootArgs
    model_cache_file_system_id: pulumi.Input[str] | None
    availability_zone: pulumi.Input[str] | None
    # With idleStopMinutes: the gateway waker's configuration (idle_stop.waker_config).
    waker_config: pulumi.Input[str] | None = None


def node_boot_args(**where) -> NodeBootArgs:
    """What every node is told, whatever machines it runs on, and `where` it runs: its
    subnet, EFA and model cache (and on hosts the user has, the login and the shared
    directory)."""
    return NodeBootArgs(
        gpus=spec.gpus_per_node,
        ray_version=spec.ray_version,
        vllm_version=spec.vllm_version,
        login_probe_key=credentials.login_probe_public_key,
        node_lock=(node_env.ROOT / spec.node_lock).read_text(),
        instance_store=spec.instance.instance_store_gb > 0,
        **where,
    )


def ec2_machines() -> Machines:
    """The stack's own: a VPC (or the user's), security groups, the EFS model cache, the
    GPU instances in their placement groups and the gateway with its Elastic IP."""
    network = Network(
        name,
        NetworkArgs(
            vpc_cidr=spec.vpc_cidr,
            instance_type=spec.instance_type,
            availability_zone=spec.availability_zone,
            existing=spec.existing_network,
        ),
    )
    security = SecurityGroups(
        name,
        SecurityArgs(
            vpc_id=network.vpc_id,
            api_allowed_cidrs=spec.api_allowed_cidrs,
            admin_cidrs=spec.admin_cidrs,
            gang_count=spec.declared_gangs,
        ),
    )
    storage = ModelStorage(
        name,
        ModelStorageArgs(
            subnet_id=network.private_subnet_id,
            efs_group_id=security.efs_group_id,
            retain_on_destroy=spec.retain_model_cache,
            existing=existing_model_cache,
        ),
    )
    # What every node is told at boot, and again by its setup command.
    node_boot = node_boot_args(
        subnet_cidr=network.private_subnet_cidr,
        efa=spec.efa,
        file_system_id=storage.file_system_id,
        access_point_id=storage.access_point_id,
        wheelhouse_access_point_id=storage.wheelhouse_access_point_id,
        file_system_dns=storage.dns_name,
    )
    nodes = GpuNodes(
        name,
        GpuNodesArgs(
            instance_type=spec.instance_type,
            node_count=spec.nodes,
            interfaces=interface_layout(spec.instance, spec.efa),
            # nodeImage's own AMI is launched as is (pinned, as amiId is).
            ami_id=spec.ami_id if spec.node_image in (NODE_IMAGE_BAKE, NODE_IMAGE_NONE) else spec.node_image,
            launch_image_id=launch_image_id(network),
            root_volume_gib=spec.root_volume_gib,
            capacity_reservation_id=spec.capacity_reservation_id,
            capacity_block=spec.capacity_block,
            placement_group_name=spec.placement_group_name,
            create_placement_group=spec.creates_placement_group,
            subnet_id=network.private_subnet_id,
            cluster_group_ids=security.cluster_group_ids,
            nodes_group_id=security.nodes_group_id,
            key_pair_name=credentials.key_pair_name,
            model_cache_arn=storage.file_system_arn,
            model_cache_access_point_arn=storage.access_point_arn,
            wheelhouse_access_point_arn=storage.wheelhouse_access_point_arn,
            boot=node_boot,
            boot_after=[*network.ready, *security.rules, *storage.ready],
            # Warm gangs too: created, set up and made ready like any gang, so that a later
            # wake is only a power-on; the park command stops them after (issue 36).
            gang_count=spec.declared_gangs,
            stop_on_shutdown=spec.idle_stop_minutes is not None,
            stage_volume=(
                stage_volume_for(spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size)
                if spec.on_stage_volume
                else None
            ),
        ),
    )
    gateway = Gateway(
        name,
        GatewayArgs(
            instance_type=spec.gateway_instance_type,
            subnet_id=network.public_subnet_id,
            gateway_group_id=security.gateway_group_id,
            key_pair_name=credentials.key_pair_name,
            user_data=gateway_user_data,
            boot_after=[*network.ready, *security.rules],
            may_wake_nodes=spec.idle_stop_minutes is not None,
            stack_id=nodes.stack_id,
        ),
    )
    return Machines(
        gateway_public_address=gateway.public_ip,
        gateway_private_ip=gateway.private_ip,
        gateway=gateway.resources,
        gangs=[
            ([instance.private_ip for instance in gang.instances], list(gang.instances), gang.host_keys)
            for gang in nodes.gangs
        ],
        gateway_host_key=gateway.host_key,
        node_boot=node_boot,
        model_cache_file_system_id=storage.file_system_id,
        availability_zone=network.availability_zone,
        waker_config=waker_config(nodes.gangs) if spec.idle_stop_minutes is not None else None,
    )


def launch_image_id(network: Network) -> pulumi.Input[str] | None:
    """The baked node image: the one found, else the one this stack bakes now in its private
    subnet (components/node_image.py). None when the stack does not bake."""
    if baked_image is None:
        return None
    if baked_image.found_id is not None:
        pulumi.log.info(f"node image: {baked_image.found_id} is baked for lock and base {baked_image.key.tag}")
        return baked_image.found_id
    image = node_image.NodeImage(
        f"{name}-node-image",
        node_image.NodeImageArgs(
            key=baked_image.key,
            bake_script=bootstrap.node_bake_script((node_env.ROOT / spec.node_lock).read_text()),
            root_device_name=baked_image.root_device_name,
            root_volume_gib=MIN_ROOT_VOLUME_GIB,
            vpc_id=network.vpc_id,
            subnet_id=network.private_subnet_id,
            baked_by=f"{pulumi.get_project()}/{pulumi.get_stack()}",
            build_after=tuple(network.ready),
        ),
    )
    return image.image_id


def waker_config(gangs) -> pulumi.Output[str]:
    """What the gateway's waker is told (idle_stop.waker_config): the region and its EC2
    endpoint as the provider resolves them, each gang's instance ids head first, and the
    expected wake time from the same sizing the planner prints."""
    region = aws.get_region_output().region
    dns_suffix = aws.get_partition_output().dns_suffix
    ids = [pulumi.Output.all(*[instance.id for instance in gang.instances]) for gang in gangs]
    names = [gang.name for gang in gangs]
    wake = idle_stop.expected_wake_seconds(
        spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size, spec.on_stage_volume
    )
    return pulumi.Output.all(region, dns_suffix, *ids).apply(
        lambda values: idle_stop.waker_config(
            region=values[0],
            endpoint=idle_stop.ec2_endpoint(values[0], values[1]),
            stack=pulumi.get_stack(),
            project=pulumi.get_project(),
            gangs=dict(zip(names, values[2:], strict=True)),
            idle_stop_minutes=spec.idle_stop_minutes,
            expected_wake_seconds=wake,
            give_up_minutes=spec.wake_give_up_minutes,
            replicas=spec.replicas,
            max_replicas=spec.max_replicas,
            # A park's drain waits as long as a request may run through the API.
            drain_timeout_seconds=spec.api_read_timeout_seconds,
            # What one gang runs at once: the scale-in's measure of whether the load fits on fewer.
            gang_max_num_seqs=spec_gang_max_num_seqs(spec),
        )
    )


def own_machines() -> Machines:
    """The user's own (hosts): nothing on AWS; one command per machine stands where its
    instance would (components/own_hosts.py)."""
    own = spec.own_hosts
    node_boot = node_boot_args(
        subnet_cidr=None,  # each node's own address
        efa=False,
        file_system_id="",
        access_point_id="",
        wheelhouse_access_point_id="",
        file_system_dns="",
        login_user=own.ssh_user,
        shared_model_dir=own.model_cache_dir,
    )
    hosts = OwnHosts(
        name,
        OwnHostsArgs(
            gateway_address=own.gateway_address,
            gangs=own.gangs,
            ssh_user=own.ssh_user,
            ssh_private_key=credentials.ssh_private_key,
            host_keys={address: own.host_key(address) for address in (own.gateway_address, *own.node_ips)},
            boot=node_boot,
        ),
    )
    return Machines(
        gateway_public_address=own.gateway_address,
        gateway_private_ip=own.gateway_private_ip,
        gateway=[hosts.gateway],
        gangs=[
            (list(ips), commands, [own.host_key(ip) for ip in ips])
            for ips, commands in zip(own.gangs, hosts.gangs, strict=True)
        ],
        gateway_host_key=own.host_key(own.gateway_address),
        node_boot=node_boot,
        model_cache_file_system_id=None,
        availability_zone=None,
    )


gateway_user_data = bootstrap.gateway_user_data()
machines = ec2_machines() if spec.own_hosts is None else own_machines()
certificate = GatewayCertificate(
    name, GatewayCertificateArgs(public_ip=machines.gateway_public_address, user_certificate=spec.tls)
)
serving_gangs = []
for index, (gang_ips, hosts, gang_host_keys) in enumerate(machines.gangs):
    serving_gangs.append(
        ServingGang(
            index=index,
            node_ips=gang_ips,
            instances=hosts,
            host_keys=gang_host_keys,
            vllm_settings=vllm_settings(spec, gang_ips, index),
            ray_token=credentials.ray_tokens[index],
        )
    )


def gateway_service_args() -> GatewayServiceArgs:
    """The gateway's part of the services: its host, setup, TLS and site, the clients'
    keys and Prometheus."""
    # What the gateway's nginx must hold: every declared gang's batch and a queue as long.
    gateway_sizing = gateway_capacity.spec_capacity(spec)
    return GatewayServiceArgs(
        public_ip=machines.gateway_public_address,
        private_ip=machines.gateway_private_ip,
        host_key=machines.gateway_host_key,
        instances=machines.gateway,
        setup_script=bootstrap.gateway_setup_script(),
        tls_certificate_pem=certificate.certificate_pem,
        tls_private_key_pem=certificate.private_key_pem,
        tls_self_signed=certificate.self_signed,
        endpoint_host=certificate.hostname,
        admin_cidrs=spec.admin_cidrs,
        api_read_timeout_seconds=spec.api_read_timeout_seconds,
        api_rate_limit_per_second=spec.api_rate_limit_per_second,
        api_max_requests_in_flight_per_key=spec.api_max_requests_in_flight_per_key,
        api_max_requests_in_flight_per_address=spec.api_max_requests_in_flight_per_address,
        gateway_connections=gateway_sizing.worker_connections,
        gateway_open_files=gateway_sizing.open_files,
        upstream_keepalive=gateway_sizing.upstream_keepalive,
        api_key=credentials.api_key,
        previous_api_key=credentials.previous_api_key,
        api_routes=spec.api_routes,
        login_probe_private_key=credentials.login_probe_private_key,
        metrics_password=credentials.metrics_password,
        disk_gib=GATEWAY_ROOT_GIB,
    )


def model_serving_args() -> ModelServingArgs:
    """The model and its serving: staging, preflight's expectations, vLLM's start and the fabric gate."""
    # The fabric gate's collectives: NCCL where the lock's torch is a CUDA build, Gloo where it
    # is a CPU build (the local hosts' lock): components/fabric.py.
    gloo_fabric = fabric.cpu_torch(
        {name: package.version for name, package in node_env.read_lock(machines.node_boot.node_lock).packages.items()}
    )
    return ModelServingArgs(
        model=spec.model,
        start_vllm_command=bootstrap.start_vllm_command(
            bootstrap.stack_probe(spec), sizing.engine_start_stall_for(spec.model, spec.instance, spec.nodes)
        ),
        model_revision=spec.model_revision,
        hf_endpoint=spec.hf_endpoint,
        gpu_memory_gib=spec.instance.gpu_memory_gib,
        efa_interfaces=efa_interface_count(spec.instance, spec.efa),
        engine_ready_timeout_seconds=sizing.engine_ready_timeout_for(spec.model, spec.instance, spec.nodes),
        serving_dir=bootstrap.serving_directory(spec),
        serves_from_local_disk=sizing.serves_from_local_disk(spec)[0],
        tensor_parallel=spec.tensor_parallel_size,
        pipeline_parallel=spec.pipeline_parallel_size,
        warmup_key=bootstrap.warmup_key(spec),
        fabric_measurement=(fabric.measurement(spec.instance, gloo_fabric) if fabric.gated(spec.nodes) else None),
        fabric_floor=fabric.floor(spec.instance, gloo_fabric, spec.fabric_floor_gbps),
    )


def idle_stop_args() -> IdleStopArgs:
    """Idle stop and the warm gangs."""
    return IdleStopArgs(
        # EC2's nodes always get their idle-stop command, 0 when the key is unset (a command
        # that vanished would leave a node's timer on); a stack of hosts none (refused there).
        minutes=(spec.idle_stop_minutes or 0) if spec.own_hosts is None else None,
        waker_config=machines.waker_config,
        never_served_grace_seconds=idle_stop.never_served_grace_seconds(
            idle_stop.expected_wake_seconds(
                spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size, spec.on_stage_volume
            ),
            spec.wake_give_up_minutes,
        ),
        replicas=spec.replicas,
        max_replicas=spec.max_replicas,
    )


services = ClusterServices(
    name,
    ServicesArgs(
        ssh_private_key=credentials.ssh_private_key,
        gateway=gateway_service_args(),
        nodes=NodesArgs(
            gangs=serving_gangs,
            boot=machines.node_boot,
            heads_api_key=credentials.heads_api_key,
            probe_api_key=credentials.probe_api_key,
            hf_token=spec.hf_token,
        ),
        serving=model_serving_args(),
        idle_stop=idle_stop_args(),
    ),
)

key_file = f"vllm-cluster-{pulumi.get_stack()}.pem"
pulumi.export("endpoint", pulumi.Output.concat("https://", certificate.hostname, "/v1"))
pulumi.export("dashboardUrl", pulumi.Output.concat("https://", certificate.hostname, f":{ports.DASHBOARD_HTTPS}/"))
# Prometheus on the gateway, behind adminCidrs and the metrics login (USER:PASSWORD, as
# `curl -u` takes it; secret).
pulumi.export(
    "metricsUrl",
    pulumi.Output.concat("https://", certificate.hostname, f":{ports.DASHBOARD_HTTPS}{metrics.ROUTE_PREFIX}/"),
)
pulumi.export("metricsLogin", pulumi.Output.concat(f"{metrics.METRICS_USER}:", credentials.metrics_password))
pulumi.export("gatewayPublicIp", machines.gateway_public_address)
# Gang 0's, as before replicas; `gangs` has every declared gang's nodes, head first, and with
# warm gangs (maxReplicas above replicas) each gang's role (topology.gang_role).
head_ips = machines.gangs[0][0]
pulumi.export("headPrivateIp", head_ips[0])
pulumi.export("workerPrivateIps", pulumi.Output.all(*head_ips[1:]))
pulumi.export(
    "gangs",
    [
        {
            "name": gang.name,
            "nodes": [{"name": node_name(index, gang.index), "ip": ip} for index, ip in enumerate(gang.node_ips)],
            **({"role": spec.gang_role(gang.index)} if spec.has_warm_gangs else {}),
        }
        for gang in serving_gangs
    ],
)
login = machines.node_boot.login_user
# Who the stack logs in as on the gateway and the nodes (the operator tools log in so too).
pulumi.export("sshUser", login)
known_hosts_file = f"vllm-cluster-{pulumi.get_stack()}.known_hosts"
pulumi.export(
    "sshCommand",
    pulumi.Output.concat(
        f"pulumi stack output --show-secrets sshPrivateKey > {key_file} && chmod 600 {key_file} && ",
        f"pulumi stack output sshKnownHosts > {known_hosts_file} && ",
        f"ssh -i {key_file} -o UserKnownHostsFile={known_hosts_file} -o StrictHostKeyChecking=yes ",
        f"-o ProxyCommand='ssh -i {key_file} -o UserKnownHostsFile={known_hosts_file} -o StrictHostKeyChecking=yes ",
        f"-W %h:%p {login}@",
        machines.gateway_public_address,
        f"' {login}@",
        head_ips[0],
    ),
)
# Every machine's SSH host key as known_hosts lines (the gateway by its public address, the
# nodes by their private ones): what the stack's connections pin, for the operator's ssh.
pulumi.export(
    "sshKnownHosts",
    pulumi.Output.all(
        machines.gateway_public_address,
        *[ip for gang in machines.gangs for ip in gang[0]],
        machines.gateway_host_key,
        *[key for gang in machines.gangs for key in gang[2]],
    ).apply(
        lambda values: host_keys.known_hosts(
            list(zip(values[: len(values) // 2], values[len(values) // 2 :], strict=True))
        )
    )
    if spec.own_hosts is None
    else spec.own_hosts.known_hosts(),
)
pulumi.export("sshPrivateKey", credentials.ssh_private_key)
pulumi.export("apiKey", credentials.api_key)
# Gang 0's Ray token: the dashboard's (dashboardUrl). Each gang has its own; a node holds its gang's.
pulumi.export("rayToken", credentials.ray_token)
pulumi.export("tlsCertificate", certificate.certificate_pem)
pulumi.export("tlsFingerprint", certificate.fingerprint)
# The readiness command's report: a real completion went through the gateway.
pulumi.export("readiness", services.readiness)
if spec.own_hosts is None:
    pulumi.export("modelCacheFileSystemId", machines.model_cache_file_system_id)
    pulumi.export("availabilityZone", machines.availability_zone)
    # What the deployed gateway's waker does (0: no idle stop): scripts/deploy wakes a
    # stack whose nodes may be stopped before `pulumi up` reaches them.
    pulumi.export("idleStopMinutes", spec.idle_stop_minutes or 0)
else:
    # The shared directory every host binds as the model cache (what the stack leaves on destroy).
    pulumi.export("modelCacheDir", spec.own_hosts.model_cache_dir)
pulumi.export(
    "topology",
    topology_summary(
        spec.nodes,
        spec.gpus_per_node,
        spec.tensor_parallel_size,
        spec.pipeline_parallel_size,
        spec.replicas,
        spec.declared_gangs,
    ),
)
