"""Where things live on the hosts (the GPU nodes and the gateway): the stack's install
directory and its commands, its configuration directory, the model cache's and the
wheelhouse's mounts, nginx's site. The scripts under scripts/ hold the same paths; tests
check both agree. Plain values, imported by what renders the hosts' files
(components/bootstrap.py, components/gateway_nginx.py) and by what runs the commands.
"""

INSTALL_DIR = "/opt/vllm-cluster"
BIN_DIR = f"{INSTALL_DIR}/bin"
NODE_COMMAND = f"{BIN_DIR}/vllm-cluster-node"
FIRST_BOOT_COMMAND = f"{BIN_DIR}/vllm-cluster-first-boot"
# What `pulumi destroy` runs on a machine of a stack of hosts (components/own_hosts.py).
REMOVE_COMMAND = f"{BIN_DIR}/vllm-cluster-remove"
GATEWAY_COMMAND = f"{BIN_DIR}/vllm-cluster-gateway"
LIBRARY_PATH = f"{INSTALL_DIR}/lib/vllm-cluster-lib.sh"
# Where the Python checks find their shared helpers: ../lib from BIN_DIR.
PYTHON_LIBRARY_PATH = f"{INSTALL_DIR}/lib/vllm_cluster_lib.py"
# The lock the node installs (vllm-cluster-node NODE_LOCK).
NODE_LOCK_PATH = f"{INSTALL_DIR}/node-env.lock"
CONFIG_DIR = "/etc/vllm-cluster"
CLUSTER_ENV = f"{CONFIG_DIR}/cluster.env"
MODEL_ROOT = "/mnt/vllm-models"
# The wheelhouse's own access point, mounted read-only but on its writer (storage.py).
WHEELHOUSE_ROOT = "/mnt/vllm-wheelhouse"
TLS_DIR = f"{CONFIG_DIR}/tls"
NGINX_SITE = "/etc/nginx/conf.d/vllm-cluster.conf"
