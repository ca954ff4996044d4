"""vllm-cluster: the Pulumi program's building blocks.

Pure modules (no Pulumi imports, tested with plain pytest):
    catalog   - the checked-in table of GPU instance types
    versions  - the Ray and vLLM versions installed on the nodes, and their security floors
    spec      - the stack's config read once into a frozen, validated ClusterSpec
    topology  - ranks, TP/PP placement, EFA interface layout, subnet math

Components (one Pulumi ComponentResource per module):
    credentials - SSH key pair and API key
    network     - VPC, subnets, gateways, routes (or an existing VPC)
    security    - security groups and their rules
    storage     - the EFS model cache
    compute     - placement group, role, launch template and GPU instances
    gateway     - the public gateway instance and its Elastic IP
"""
