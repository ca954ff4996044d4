"""Security groups: who may talk to whom, and why.

- gateway: the only thing reachable from outside. HTTPS API from apiAllowedCidrs;
  SSH and the dashboard proxy from adminCidrs only.
- nodes: on every GPU node's primary interface. Admits the gateway only on the
  ports it proxies and on SSH (the gateway is the SSH jump host).
- cluster: one per gang (replica), on every interface of that gang's GPU nodes,
  EFA ones included. All traffic to and from itself, inbound and outbound: EFA
  drops traffic without both rules, and Ray and vLLM use random ports between
  nodes. A group of its own per gang: the self rule admits anything, so a shared
  group would let a node of one gang reach another gang's vLLM port (past the
  gateway's route allowlist), its NCCL and its Ray ports. EFA only needs the gang.
- efs: the model cache's mount target. NFS from the gangs' cluster groups only.

Rules are separate resources (not inline) so each carries its own description
and a change to one rule does not rewrite the group.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components import ports
from components.tagging import renamed_from, tags
from components.topology import gang_prefix

ALL_TRAFFIC = "-1"
ALL_PORTS = None


@dataclass
class SecurityArgs:
    vpc_id: pulumi.Input[str]
    api_allowed_cidrs: tuple[str, ...]
    admin_cidrs: tuple[str, ...]
    # Every gang the stack declares (maxReplicas, warm ones too): each gets a cluster group of its own.
    gang_count: int = 1


def _cidr_args(cidr: str) -> dict[str, str]:
    family = ipaddress.ip_network(cidr).version
    return {"cidr_ipv4": cidr} if family == 4 else {"cidr_ipv6": cidr}


def _slug(cidr: str) -> str:
    return cidr.replace("/", "-").replace(":", "-").replace(".", "-")


class SecurityGroups(pulumi.ComponentResource):
    gateway_group_id: pulumi.Output[str]
    nodes_group_id: pulumi.Output[str]
    # Gang 0's cluster group, and every gang's (gang 0 first).
    cluster_group_id: pulumi.Output[str]
    cluster_group_ids: list[pulumi.Output[str]]
    efs_group_id: pulumi.Output[str]
    # Every rule; instances wait for them, since a group without its rules has no egress.
    rules: list[pulumi.Resource]

    def __init__(self, name: str, args: SecurityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:SecurityGroups", name, None, opts)
        self._name = name
        self._child = pulumi.ResourceOptions(parent=self)
        self.rules = []

        gateway = self._group(
            "gateway", args.vpc_id, "vllm-cluster gateway: TLS API for clients, SSH and dashboard for admins"
        )
        nodes = self._group("nodes", args.vpc_id, "vllm-cluster GPU nodes: reachable from the gateway only")
        # Gang 0's group keeps the name and description it had before replicas: a
        # group's description is fixed at creation, and a new one would replace it.
        clusters = [
            self._group(
                f"{gang_prefix(gang)}cluster",
                args.vpc_id,
                "vllm-cluster GPU nodes among themselves: EFA, Ray, NCCL" + (f" (gang {gang} only)" if gang else ""),
            )
            for gang in range(args.gang_count)
        ]
        efs = self._group("efs", args.vpc_id, "vllm-cluster model cache (EFS mount target)")
        self._gateway_rules(gateway, nodes, args)
        self._nodes_rules(nodes, gateway, efs)
        for gang, cluster in enumerate(clusters):
            self._cluster_rules(cluster, gang_prefix(gang))
            self._efs_rules(efs, cluster, gang_prefix(gang))

        self.gateway_group_id = gateway.id
        self.nodes_group_id = nodes.id
        self.cluster_group_ids = [cluster.id for cluster in clusters]
        self.cluster_group_id = self.cluster_group_ids[0]
        self.efs_group_id = efs.id
        self.register_outputs(
            {
                "gatewayGroupId": self.gateway_group_id,
                "nodesGroupId": self.nodes_group_id,
                "clusterGroupId": self.cluster_group_id,
                "clusterGroupIds": self.cluster_group_ids,
                "efsGroupId": self.efs_group_id,
            }
        )

    def _gateway_rules(self, gateway, nodes, args: SecurityArgs) -> None:
        """The only group with rules that name outside addresses."""
        self._gateway_from_outside(gateway, args)
        self._gateway_with_nodes(gateway, nodes)

    def _gateway_from_outside(self, gateway, args: SecurityArgs) -> None:
        """The clients' API and the admins' SSH and dashboard, each from its own CIDRs."""
        for cidr in args.api_allowed_cidrs:
            self._ingress(
                f"gateway-api-{_slug(cidr)}",
                gateway,
                ports.API_HTTPS,
                cidr=cidr,
                why=f"OpenAI-compatible API over TLS for allowed clients {cidr} (apiAllowedCidrs)",
            )
        for cidr in args.admin_cidrs:
            self._ingress(
                f"gateway-ssh-{_slug(cidr)}",
                gateway,
                ports.SSH,
                cidr=cidr,
                why=f"SSH for admins {cidr} (adminCidrs); the gateway is the jump host to the GPU nodes",
            )
            self._ingress(
                f"gateway-dashboard-{_slug(cidr)}",
                gateway,
                ports.DASHBOARD_HTTPS,
                cidr=cidr,
                why=f"Ray dashboard over TLS for admins {cidr} (adminCidrs) only: it can run any code",
            )

    def _gateway_with_nodes(self, gateway, nodes) -> None:
        """The nodes in on the API and Prometheus, the gateway out to the nodes on what it
        proxies, scrapes and jumps to, and out to the internet for its packages."""
        self._ingress(
            "gateway-api-from-nodes",
            gateway,
            ports.API_HTTPS,
            group=nodes,
            why="Readiness check: a real completion from the head through the gateway TLS and route allowlist",
        )
        self._ingress(
            "gateway-prometheus-from-nodes",
            gateway,
            ports.PROMETHEUS,
            group=nodes,
            why="The Ray dashboard on each head reads Prometheus (RAY_PROMETHEUS_HOST), which has no login",
        )
        self._egress(
            "gateway-to-vllm", gateway, ports.VLLM_API, group=nodes, why="Proxy API requests to vLLM on the head node"
        )
        self._egress(
            "gateway-to-dashboard",
            gateway,
            ports.RAY_DASHBOARD,
            group=nodes,
            why="Proxy the Ray dashboard on the head node for admins",
        )
        self._egress(
            "gateway-to-ray-metrics",
            gateway,
            ports.RAY_METRICS,
            group=nodes,
            why="Prometheus on the gateway scrapes the Ray metrics of every node",
        )
        self._egress(
            "gateway-to-ssh",
            gateway,
            ports.SSH,
            group=nodes,
            why="SSH jump from the gateway to the GPU nodes (remote commands, admins)",
        )
        self._egress(
            "gateway-https-out", gateway, 443, cidr="0.0.0.0/0", why="Package installs over HTTPS (nginx) and AWS APIs"
        )
        self._egress(
            "gateway-http-out",
            gateway,
            80,
            cidr="0.0.0.0/0",
            why="Ubuntu package mirrors over HTTP (apt checks signatures)",
        )

    def _nodes_rules(self, nodes, gateway, efs) -> None:
        """The gateway in, the internet out through the NAT."""
        self._ingress(
            "nodes-vllm-from-gateway", nodes, ports.VLLM_API, group=gateway, why="vLLM API, proxied by the gateway only"
        )
        self._ingress(
            "nodes-dashboard-from-gateway",
            nodes,
            ports.RAY_DASHBOARD,
            group=gateway,
            why="Ray dashboard, proxied by the gateway for admins only",
        )
        self._ingress(
            "nodes-ray-metrics-from-gateway",
            nodes,
            ports.RAY_METRICS,
            group=gateway,
            why="Ray metrics (no auth of their own), scraped by Prometheus on the gateway only",
        )
        self._ingress(
            "nodes-ssh-from-gateway", nodes, ports.SSH, group=gateway, why="SSH through the gateway as jump host"
        )
        self._egress(
            "nodes-https-out",
            nodes,
            443,
            cidr="0.0.0.0/0",
            why="Model downloads from Hugging Face and pip installs, through the NAT gateway",
        )
        self._egress(
            "nodes-http-out",
            nodes,
            80,
            cidr="0.0.0.0/0",
            why="Ubuntu package mirrors over HTTP (apt checks signatures), through the NAT gateway",
        )
        self._egress(
            "nodes-to-prometheus",
            nodes,
            ports.PROMETHEUS,
            group=gateway,
            why="The Ray dashboard on each head reads Prometheus on the gateway",
        )
        self._egress("nodes-nfs-out", nodes, ports.NFS, group=efs, why="Mount the EFS model cache (NFS over TLS)")

    def _cluster_rules(self, cluster, prefix: str) -> None:
        """The EFA rule, both directions, to and from itself (the gang's own group)."""
        self._ingress(
            f"{prefix}cluster-self-in",
            cluster,
            ALL_PORTS,
            group=cluster,
            why="EFA requires all traffic from this group itself; Ray and NCCL use random ports between nodes",
        )
        self._egress(
            f"{prefix}cluster-self-out",
            cluster,
            ALL_PORTS,
            group=cluster,
            why="EFA requires all traffic to this group itself; Ray and NCCL use random ports between nodes",
        )

    def _efs_rules(self, efs, cluster, prefix: str) -> None:
        """NFS from a gang's cluster group only."""
        self._ingress(
            f"efs-nfs-from-{prefix}cluster",
            efs,
            ports.NFS,
            group=cluster,
            why="NFS to the model cache, from the GPU nodes only",
        )

    def _group(self, role: str, vpc_id: pulumi.Input[str], description: str) -> aws.ec2.SecurityGroup:
        # No inline rules: the provider then also removes AWS's default allow-all egress.
        # The description is fixed at creation: changing it replaces the group.
        # Groups that existed before the renaming (issue 12) carry their old name as an
        # alias; a later gang's group never had another name.
        had_older_name = role in ("gateway", "nodes", "cluster", "efs")
        return aws.ec2.SecurityGroup(
            f"{self._name}-{role}-sg",
            vpc_id=vpc_id,
            description=description,
            tags=tags(f"{self._name}-{role}-sg"),
            opts=(
                renamed_from(f"{self._name}-{role}", parent=self)
                if had_older_name
                else pulumi.ResourceOptions(parent=self)
            ),
        )

    def _ingress(self, rule: str, target, port: int | None, why: str, cidr: str | None = None, group=None) -> None:
        self._rule(aws.vpc.SecurityGroupIngressRule, rule, target, port, why, cidr, group)

    def _egress(self, rule: str, target, port: int | None, why: str, cidr: str | None = None, group=None) -> None:
        self._rule(aws.vpc.SecurityGroupEgressRule, rule, target, port, why, cidr, group)

    def _rule(self, resource_type, rule: str, target, port: int | None, why: str, cidr: str | None, group) -> None:
        """One TCP port, or every protocol and port when `port` is ALL_PORTS."""
        if (cidr is None) == (group is None):
            raise ValueError("a rule names exactly one peer: a CIDR or a security group")
        peer = _cidr_args(cidr) if cidr is not None else {"referenced_security_group_id": group.id}
        ports_args = (
            {"ip_protocol": ALL_TRAFFIC}
            if port is ALL_PORTS
            else {"ip_protocol": "tcp", "from_port": port, "to_port": port}
        )
        self.rules.append(
            resource_type(
                f"{self._name}-{rule}",
                security_group_id=target.id,
                description=why,
                **ports_args,
                **peer,
                opts=self._child,
            )
        )
