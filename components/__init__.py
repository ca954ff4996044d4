"""vllm-cluster: the modules `__main__.py` builds the stack from.

Plain Python, no Pulumi (tested with plain pytest; the planner uses them too):
    catalog   - the checked-in table of GPU instance types
    models    - the checked-in table of common models, for sizing
    versions  - the Ray and vLLM versions installed on the nodes, and their security floors
    spec      - the stack's config read once into a frozen, validated ClusterSpec
    topology  - ranks, TP/PP placement, EFA interface layout, subnet math
    sizing    - memory fit, KV cache, cost and time to first token
    image     - facts of the GPU nodes' image (Deep Learning Base AMI)
    node_env  - what the nodes' Python environment holds, per target: the inputs of the locks in locks/
    ports     - every port the cluster uses
    bootstrap - what the hosts are given: user data, env files, vllm serve arguments, nginx site

Components (one Pulumi ComponentResource per module, type vllm-cluster:index:<Class>):
    credentials - Credentials: SSH key pair, API key, Ray token, the gateway's login probe key
    network     - Network: VPC, public and private subnet, internet and NAT gateway, routes (or an existing VPC)
    security    - SecurityGroups: the gateway, nodes, cluster and efs groups, one resource per rule
    storage     - ModelStorage: the EFS model cache, its mount target, access point and TLS-only policy
    compute     - GpuNodes: placement group, instance role, launch template, the head and the workers
    gateway     - Gateway: the public gateway instance and its Elastic IP
    certificate - GatewayCertificate: the gateway's TLS certificate, the user's or self-signed
    services    - ClusterServices: the remote commands that set up the hosts and start Ray and vLLM

And tagging: how resources are named and tagged, and the alias of a renamed one.
"""
