"""vllm-cluster: the modules `__main__.py` builds the stack from.

Who may import what: `__main__.py`, cli/, localhosts/, tools/, bench/ and tests/ import
these modules; these modules import nothing from those folders, and no two of them
import each other, directly or round a circle (tests/test_code_shape.py). The pure
modules sit below the components that declare resources.

Plain Python, no Pulumi (tested with plain pytest; the planner uses them too):
    config_keys   - every config key: its Pulumi.yaml type, default and description
    spec/         - the stack's config read once into a frozen, validated ClusterSpec; a
                    package of one module a domain (model source, engine settings, shape,
                    gateway, secrets, node software, network, capacity, storage, own
                    hosts, sleep and wake), loader.py holds load_spec
    catalog       - the checked-in table of GPU instance types
    models        - the checked-in table of common models, for sizing
    versions      - the node software's versions (Ray, vLLM, efs-utils) and security floors
    topology      - ranks, TP/PP placement, EFA interface layout, subnet math
    sizing/       - the planner's arithmetic, one module a question: the model's size,
                    memory fit, cost, the model's bytes to each engine, time to first token
    image         - facts of the GPU nodes' image (Deep Learning Base AMI)
    node_env      - what the nodes' Python environment holds, per target: the inputs of the locks in locks/
    ports         - every port the cluster uses
    host_paths    - where things live on the hosts
    api_routes    - the routes the gateway may forward and the stack's probe request
    bootstrap     - what the hosts are given: user data, env files, vllm serve arguments, API keys
    gateway_nginx - the gateway's nginx site
    metrics       - Prometheus on the gateway: configuration, targets, rules
    prometheus_sizing - whether the gateway holds Prometheus for the stack
    idle_stop     - idle stop and wake: the gateway's policy, the waker's configuration, costs
    scale_out     - when the waker starts one more warm gang
    warm_pool_cost - what a warm pool costs
    stage_volume  - the gp3 data volume that keeps a node's stage across a stop
    fabric        - the fabric gate's floor and measurement
    host_keys     - the SSH host keys every connection pins
    quotas        - EC2's vCPU quotas the stack needs
    aws_contract  - what EC2, IAM and EFS would refuse, checked before anything exists

Components (one Pulumi ComponentResource per module, type vllm-cluster:index:<Class>):
    credentials - Credentials: SSH key pair, API key, Ray token, the gateway's login probe key
    network     - Network: VPC, public and private subnet, internet and NAT gateway, routes (or an existing VPC)
    security    - SecurityGroups: the gateway, nodes, cluster and efs groups, one resource per rule
    storage     - ModelStorage: the EFS model cache, its mount target, access point and TLS-only policy
    compute     - GpuNodes: placement group, instance role, launch template, the head and the workers
    node_image  - the baked node image (EC2 Image Builder)
    gateway     - Gateway: the public gateway instance and its Elastic IP
    certificate - GatewayCertificate: the gateway's TLS certificate, the user's or self-signed
    own_hosts   - the machines of a stack of hosts the user already has
    services    - ClusterServices: the remote commands that set up the hosts and start Ray
                  and vLLM, in order; its steps are gateway_commands and node_commands,
                  given the records of services_args, reaching hosts by remote_commands

And tagging: how resources are named and tagged, and the alias of a renamed one.
"""
