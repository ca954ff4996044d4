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

# Ports that must never be reachable from the internet (Ray's own security guidance;
# CVE-2023-48022 "ShadowRay" is exploited in the wild). tests/test_program.py checks
# that no rule open to the whole internet admits one of them.
NEVER_PUBLIC = (SSH, RAY_GCS, RAY_DASHBOARD, RAY_CLIENT)
