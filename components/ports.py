"""Every port the cluster uses, named once. Security groups, the gateway's proxy
and the node scripts all read them from here."""

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
NFS = 2049

# Ports that must never be reachable from the internet (Ray's own security guidance;
# CVE-2023-48022 "ShadowRay" is exploited in the wild).
NEVER_PUBLIC = (SSH, RAY_GCS, RAY_DASHBOARD, RAY_CLIENT)
