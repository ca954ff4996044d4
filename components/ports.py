"""Every port the cluster uses, written once, here and nowhere else.

components/security.py opens them in the security groups and __main__.py puts the
dashboard's in the URL it exports. components/bootstrap.py renders them into the
gateway's nginx site and vLLM's `--port`, and hands the ones the hosts use to them as
PORT_<name> (bootstrap.port_env): cluster.env carries them, the node's setup copies
them into node.env, and the systemd units and the node scripts read them from there.
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
# Ray's token auth: only the gateway may reach it.
RAY_METRICS = 8080
# Prometheus on the gateway: Prometheus's own default port (`--web.listen-address`
# 0.0.0.0:9090) and where Ray's dashboard looks first (RAY_PROMETHEUS_HOST
# http://localhost:9090). It has no login, so it listens on the gateway's loopback:
# users reach it through nginx on DASHBOARD_HTTPS under /prometheus/ behind the stack's
# metrics login, and the GPU nodes (Ray's dashboard on each head reads it) reach nginx on
# this port of the gateway's private address, which passes them its query API alone
# (bootstrap.nginx_site); a security group rule admits the nodes' group only. Its admin
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
NEVER_PUBLIC = (SSH, RAY_GCS, RAY_DASHBOARD, RAY_CLIENT, RAY_METRICS, PROMETHEUS, WAKER)
