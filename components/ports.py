"""Every port the cluster uses, written once, here and nowhere else.

components/security.py opens them in the security groups and __main__.py puts the
dashboard's in the URL it exports. components/bootstrap.py renders them into the
gateway's nginx site, vLLM's `--port` and the nodes' host firewall (host_firewall),
and hands the ones the hosts use to them as PORT_<name> (bootstrap.port_env):
cluster.env carries them, the node's setup copies them into node.env, and the systemd
units and the node scripts read them from there.
No host file holds a port number (tests/test_host_ports.py moves every port and
follows it to the hosts).
"""

# Not configured on any host: the image's sshd listens on its default, and the
# gateway's ssh dials that default. Only the security groups use this.
SSH = 22
# The gateway's public HTTPS port for the OpenAI-compatible API (nginx, TLS).
API_HTTPS = 443
# The gateway's admin-only HTTPS port that proxies the Ray dashboard.
DASHBOARD_HTTPS = 8443
# vLLM's OpenAI server on the head, reached only from the gateway.
VLLM_API = 8000
# Ray: GCS, dashboard (which is also the Jobs API: remote code execution), client.
RAY_GCS = 6379
RAY_DASHBOARD = 8265
RAY_CLIENT = 10001
# EFS (NFS): the mount helper's default; only the security groups use this.
NFS = 2049
# Ray's Prometheus endpoint on every node (`ray start --metrics-export-port`), scraped by
# the gateway. Ray 2.60 has no default: unset, each node binds a random port
# (ray/_private/node.py), which no scrape config can name. 8080 is KubeRay's default
# metrics port (DefaultMetricsPort, ray-project/kuberay PR #954) and the one Ray's
# metrics docs use (`ray start --head --metrics-export-port=8080`,
# doc/source/ray-observability/ray-metrics.rst in ray 1.11); it lies below Linux's ephemeral range 32768-60999
# (net.ipv4.ip_local_port_range), so no outgoing connection of NCCL, Ray or vLLM can
# hold it first, and outside Ray's worker ports 10002-19999 (`ray start
# --min-worker-port/--max-worker-port` defaults). The endpoint has no auth, even with
# Ray's token auth: only the gateway may reach it. Ray binds it on every address
# (dashboard/modules/reporter/reporter_agent.py gives the exporter the address "" unless
# the node's IP is loopback): the host firewall keeps it to the gang and the gateway.
RAY_METRICS = 8080
# Ray's other listeners on every node. Unset, `ray start` takes a random port for each
# (the node manager and the object manager of the raylet, the dashboard agent's gRPC,
# the runtime environment agent: "Default: Random value", doc/source/ray-core/
# configure.rst, "Ports configurations"), which no firewall can name. Pinned here, each
# by its own `ray start` flag (Ray 2.60, ray/scripts/scripts.py): --node-manager-port,
# --object-manager-port, --dashboard-agent-grpc-port, --runtime-env-agent-port,
# --dashboard-agent-listen-port. Ray binds the raylet's two (its C++ gRPC servers, like
# the GCS's) and the agent's gRPC on every address whatever --node-ip-address says
# (measured with `ss -ltn` on a node; dashboard/agent.py binds the gRPC to
# get_all_interfaces_ip()), so only the host firewall (bootstrap.host_firewall) keeps
# them to the gang. All below Linux's ephemeral range 32768-60999, so no outgoing
# connection holds one first, and outside the worker ports below.
RAY_NODE_MANAGER = 8076
RAY_OBJECT_MANAGER = 8077
RAY_RUNTIME_ENV_AGENT = 8078
RAY_DASHBOARD_AGENT_GRPC = 8079
# The dashboard agent's HTTP port: Ray's default is 52365
# (DEFAULT_DASHBOARD_AGENT_LISTEN_PORT, ray/_private/ray_constants.py), inside the
# ephemeral range; 8081 is not.
RAY_DASHBOARD_AGENT_HTTP = 8081
# The head's own Prometheus endpoints, on every address and without a login: the
# dashboard's (DASHBOARD_METRIC_PORT, default 44227, ray/dashboard/consts.py) and the
# autoscaler monitor's (AUTOSCALER_METRIC_PORT, default 44217,
# ray/autoscaler/_private/constants.py). `ray start` has no flag for them; Ray reads
# each from the environment variable of that name (env_integer), which node.env sets.
RAY_DASHBOARD_METRICS = 8082
RAY_AUTOSCALER_METRICS = 8083
# The fabric gate's rendezvous on a gang's head (scripts/node/fabric-check, components/
# fabric.py): torch.distributed's TCP store, which rank 0 binds on every address while the
# gang's all-reduce is measured before vLLM starts. Pinned so the host firewall can keep
# it to the gang (its store has no login). Below Linux's ephemeral range 32768-60999 and
# outside Ray's worker ports, beside Ray's pinned ones; nothing else on a node binds it.
FABRIC_RENDEZVOUS = 8084
# The ports Ray's workers (and vLLM's engine, a Ray driver) bind, one each, on every
# address: Ray's own defaults (`ray start --min-worker-port 10002 --max-worker-port
# 19999`, doc/source/ray-core/configure.rst: "All ports in the range should be open"),
# passed explicitly so that the firewall and Ray name the same range.
RAY_MIN_WORKER = 10002
RAY_MAX_WORKER = 19999
# Prometheus on the gateway: Prometheus's own default port (`--web.listen-address`
# 0.0.0.0:9090) and where Ray's dashboard looks first (RAY_PROMETHEUS_HOST
# http://localhost:9090). It has no login, so it listens on the gateway's loopback:
# users reach it through nginx on DASHBOARD_HTTPS under /prometheus/ behind the stack's
# metrics login, and the GPU nodes (Ray's dashboard on each head reads it) reach nginx on
# this port of the gateway's private address, which passes them its query API alone
# (gateway_nginx.nginx_site); a security group rule admits the nodes' group only. Its admin
# and lifecycle APIs stay off (Prometheus's --web.enable-admin-api and
# --web.enable-lifecycle are off by default).
PROMETHEUS = 9090
# The gateway's waker (scripts/gateway/vllm-cluster-waker), on the gateway's loopback only:
# nginx hands it the API requests no gang could take (error_page 502 504), and it starts
# the gangs an idle stop powered off. Below Linux's ephemeral range 32768-60999
# (net.ipv4.ip_local_port_range), so none of nginx's own connections to the gangs can
# hold it first; no package on the gateway (nginx, Prometheus, sshd) listens there.
WAKER = 8099

# Ports that must never be reachable from the internet (Ray's own security guidance;
# CVE-2023-48022 "ShadowRay" is exploited in the wild). tests/test_program.py checks
# that no rule open to the whole internet admits one of them. Ray's metrics and
# Prometheus have no login of their own: the gateway reaches the one, nginx the other.
NEVER_PUBLIC = (
    SSH,
    RAY_GCS,
    RAY_DASHBOARD,
    RAY_CLIENT,
    RAY_METRICS,
    RAY_NODE_MANAGER,
    RAY_OBJECT_MANAGER,
    RAY_RUNTIME_ENV_AGENT,
    RAY_DASHBOARD_AGENT_GRPC,
    RAY_DASHBOARD_AGENT_HTTP,
    RAY_DASHBOARD_METRICS,
    RAY_AUTOSCALER_METRICS,
    FABRIC_RENDEZVOUS,
    RAY_MIN_WORKER,
    RAY_MAX_WORKER,
    PROMETHEUS,
    WAKER,
)
