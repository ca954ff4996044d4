"""What the hosts are given: user data, env files, systemd units, the vLLM argument
list and the gateway's nginx site. Rendered by components/bootstrap.py, checked
here without Pulumi; the nginx site is checked by Debian's own nginx (`nginx -t`)."""

from __future__ import annotations

import base64
import fnmatch
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components import api_routes, bootstrap, gateway_nginx, host_paths, image, metrics, node_env, ports
from components.bootstrap import NodeBoot
from components.compute import compress_user_data
from components.spec import MAX_API_KEY_LENGTH, load_spec
from tests.pulumi_mocks import stack_config

ROOT = Path(__file__).resolve().parent.parent
SHELLCHECK = shutil.which("shellcheck") or str(ROOT / "venv" / "bin" / "shellcheck")
NODE_SCRIPT = (ROOT / "scripts" / "node" / "vllm-cluster-node").read_text()
LIBRARY = (ROOT / "scripts" / "lib" / "vllm-cluster-lib.sh").read_text()
UNITS = ROOT / "scripts" / "node" / "units"

BASE = {
    "model": "Qwen/Qwen2.5-1.5B-Instruct",
    "instanceType": "g5.12xlarge",
    "apiAllowedCidrs": ["203.0.113.0/24"],
    "adminCidrs": ["198.51.100.7/32"],
}


def spec_of(**overrides):
    return load_spec({**BASE, **overrides}, stack="test")


def boot(index: int = 1, **overrides) -> NodeBoot:
    values = dict(
        index=index,
        head_ip="" if index == 0 else "10.42.128.10",
        subnet_cidr="10.42.128.0/17",
        gpus=8,
        efa=True,
        file_system_id="fs-0123456789abcdef0",
        access_point_id="fsap-0123456789abcdef0",
        file_system_dns="fs-0123456789abcdef0.efs.us-east-1.amazonaws.com",
        ray_version="2.60.0",
        vllm_version="0.33.0",
        login_probe_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHprobeprobeprobeprobeprobeprobeprobeprobe01",
        node_lock=node_env.default_lock_path().read_text(),
        # What the setup command adds: the gang (head first) and the gateway, for the firewall.
        gang_ips=("10.42.128.10", "10.42.128.11"),
        gateway_ip="10.42.0.10",
    )
    values.update(overrides)
    return NodeBoot(**values)


def parse_env(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value.strip('"')
    return values


# --- vllm serve arguments ------------------------------------------------------------


def test_serve_args_carry_tp_pp_and_the_ray_backend():
    config = {
        key.split(":", 1)[1]: value for key, value in stack_config("prod").items() if key.startswith("vllm-cluster:")
    }
    spec = load_spec(config, stack="prod")
    args = bootstrap.vllm_serve_args(spec, "10.42.128.10")
    flag = {args[i]: args[i + 1] for i in range(1, len(args) - 1) if args[i].startswith("--")}
    assert flag["--tensor-parallel-size"] == "8" and flag["--pipeline-parallel-size"] == "2"
    assert flag["--distributed-executor-backend"] == "ray"
    assert flag["--host"] == "10.42.128.10" and flag["--port"] == str(ports.VLLM_API)
    assert flag["--gpu-memory-utilization"] == "0.92" and flag["--max-model-len"] == "16384"


def test_serve_args_start_with_the_model_on_the_nodes_own_disk_at_its_revision():
    # g6.xlarge has an instance store (components/catalog.py): each node serves its stage from it.
    args = bootstrap.vllm_serve_args(spec_of(modelRevision="v1.0"), "10.0.0.1")
    assert args[0] == "/opt/dlami/nvme/vllm-cluster/models/Qwen/Qwen2.5-1.5B-Instruct/v1.0"


def test_without_an_instance_store_vllm_serves_from_the_shared_cache(monkeypatch):
    monkeypatch.setattr(bootstrap.sizing, "serves_from_local_disk", lambda spec: (False, "no instance store"))
    args = bootstrap.vllm_serve_args(spec_of(modelRevision="v1.0"), "10.0.0.1")
    assert args[0] == "/mnt/vllm-models/models/Qwen/Qwen2.5-1.5B-Instruct/v1.0"
    assert args[args.index("--served-model-name") + 1] == "Qwen/Qwen2.5-1.5B-Instruct"


def test_optional_settings_appear_only_when_set_and_extra_args_come_last():
    args = bootstrap.vllm_serve_args(spec_of(vllmExtraArgs=["--max-num-seqs", "64"]), "10.0.0.1")
    assert "--max-model-len" not in args and "--gpu-memory-utilization" not in args
    assert args[-2:] == ["--max-num-seqs", "64"]


def test_the_api_key_never_reaches_the_serve_args_or_vllm_env():
    key = "s" * 40
    spec = load_spec({**BASE, "apiKey": key}, stack="test", secret_keys={"apiKey"})
    text = bootstrap.vllm_env(spec, "10.0.0.1", ["10.0.0.1"])
    assert key not in text and "--api-key" not in text


def test_vllm_env_names_every_node_and_gpu_it_must_wait_for():
    spec = load_spec({**BASE, "instanceType": "p4d.24xlarge", "nodes": 3}, stack="test")
    env = parse_env(bootstrap.vllm_env(spec, "10.0.0.1", ["10.0.0.1", "10.0.0.2", "10.0.0.3"]))
    assert env["EXPECTED_NODES"] == "head=10.0.0.1,worker-1=10.0.0.2,worker-2=10.0.0.3"
    assert env["EXPECTED_GPUS"] == "24"
    assert env["HF_HUB_OFFLINE"] == "1"  # the model is staged first; vLLM never downloads
    assert env["SERVE_ARGS"].split() == bootstrap.vllm_serve_args(spec, "10.0.0.1")


def test_every_vllm_variable_the_stack_sets_is_one_vllm_knows():
    """vLLM takes every VLLM_* variable in its environment for its own and warns at start
    about one it does not know: the stack's own keys in vllm.env carry no VLLM_ prefix."""
    spec = load_spec({**BASE, "nodes": 2}, stack="test")
    env = parse_env(bootstrap.vllm_env(spec, "10.0.0.1", ["10.0.0.1", "10.0.0.2"]))
    ours = {key for key in env if key.startswith("VLLM_")}
    assert ours == set(bootstrap.VLLM_VARIABLES_SET), ours


def stack_spec(stack: str):
    config = {
        key.split(":", 1)[1]: value for key, value in stack_config(stack).items() if key.startswith("vllm-cluster:")
    }
    return load_spec(config, stack=stack)


def engine_ready_timeout(stack: str) -> int:
    env = parse_env(bootstrap.vllm_env(stack_spec(stack), "10.0.0.1", ["10.0.0.1", "10.0.0.2"]))
    return int(env["VLLM_ENGINE_READY_TIMEOUT_S"])


def test_a_70b_cold_start_gets_more_than_vllms_600_second_engine_timeout():
    """vLLM gives up on its engine after VLLM_ENGINE_READY_TIMEOUT_S (600 s by default);
    prod's 70B from EFS can take longer, and systemd would restart it in a loop."""
    assert engine_ready_timeout("prod") > 600


def test_a_small_model_keeps_vllms_own_600_second_floor():
    assert engine_ready_timeout("dev") == 600


def test_env_files_refuse_values_a_shell_or_systemd_would_interpret():
    for bad in ("a;b", "$(id)", "x`y`", "a\nb", 'q"uote'):
        with pytest.raises(ValueError):
            bootstrap.env_file({"KEY": bad}, header="t")


def test_env_files_are_read_the_same_by_bash(tmp_path):
    text = bootstrap.env_file({"ONE": "plain", "MANY": "--a 1 --b x/y:z"}, header="test")
    path = tmp_path / "test.env"
    path.write_text(text)
    out = subprocess.run(
        ["bash", "-c", f'set -a; . {path}; printf "%s|%s" "$ONE" "$MANY"'], capture_output=True, text=True, check=True
    ).stdout
    assert out == "plain|--a 1 --b x/y:z"


# --- user data ------------------------------------------------------------------------


def test_cluster_env_carries_role_head_subnet_and_model_cache():
    env = parse_env(bootstrap.cluster_env(boot(2)))
    assert env["NODE_NAME"] == "worker-2" and env["NODE_ROLE"] == "worker"
    assert env["HEAD_IP"] == "10.42.128.10" and env["NODE_SUBNET_CIDR"] == "10.42.128.0/17"
    assert env["MODEL_CACHE_ACCESS_POINT_ID"] == "fsap-0123456789abcdef0"
    assert env["EFA_ENABLED"] == "true" and env["GPUS_PER_NODE"] == "8"
    head = parse_env(bootstrap.cluster_env(boot(0)))
    assert head["NODE_ROLE"] == "head" and head["HEAD_IP"] == ""


def test_cluster_env_says_whether_the_instance_type_has_an_instance_store():
    """Issue 34 point 3: the node refuses to stage its copy anywhere but on the instance
    store's mount when its type has one (the catalog's InstanceStorageInfo)."""
    assert parse_env(bootstrap.cluster_env(boot(1, instance_store=True)))["INSTANCE_STORE"] == "true"
    assert parse_env(bootstrap.cluster_env(boot(1, instance_store=False)))["INSTANCE_STORE"] == "false"


def write_files_of(script: str, root: Path, last_line: str) -> None:
    """Run a rendered script's file-writing part against a scratch root."""
    assert script.endswith(last_line)
    lines = []
    for line in script.removesuffix(last_line).split("\n"):
        # Only the script's own commands move to the scratch root, not the files' contents.
        if line.startswith("install "):
            for path in ("/opt/vllm-cluster", "/etc/vllm-cluster", "/etc/systemd/system"):
                line = line.replace(f" {path}", f" {root}{path}").replace(f'"{path}', f'"{root}{path}')
        lines.append(line)
    subprocess.run(["bash", "-s"], input="\n".join(lines), text=True, check=True)


def test_setup_script_writes_the_real_scripts_and_units_byte_for_byte(tmp_path):
    """Every file the stack's setup command writes is the repository's file, unchanged."""
    write_files_of(
        bootstrap.node_setup_script(boot(1)), tmp_path, "exec /opt/vllm-cluster/bin/vllm-cluster-node setup\n"
    )
    installed = tmp_path / "opt/vllm-cluster"
    for name in (
        "vllm-cluster-node",
        "vllm-cluster-first-boot",
        "ray-cluster-check",
        "preflight-check",
        "vllm-watchdog-check",
        "vllm-idle-check",
        "node-env",
    ):
        assert (installed / "bin" / name).read_text() == (ROOT / "scripts/node" / name).read_text(), name
        assert (installed / "bin" / name).stat().st_mode & 0o777 == 0o755
    assert (installed / "lib/vllm-cluster-lib.sh").read_text() == LIBRARY
    assert (installed / "lib/vllm_cluster_lib.py").read_text() == (ROOT / "scripts/lib/vllm_cluster_lib.py").read_text()
    # The Python checks import their shared helpers from ../lib, where the script put them.
    for check in ("ray-cluster-check", "vllm-watchdog-check", "vllm-idle-check", "preflight-check"):
        loaded = subprocess.run(
            [sys.executable, "-c", "import runpy, sys; runpy.run_path(sys.argv[1])", str(installed / "bin" / check)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert loaded.returncode == 0, (check, loaded.stderr)
    # node-env too (it runs with the image's Python before any virtualenv exists).
    usage = subprocess.run([sys.executable, str(installed / "bin/node-env"), "--help"], capture_output=True, text=True)
    assert usage.returncode == 0, usage.stderr
    # The lock the stack chose, where the node script reads it.
    lock = tmp_path / host_paths.NODE_LOCK_PATH.lstrip("/")
    assert lock.read_text() == boot(1).node_lock and lock.stat().st_mode & 0o777 == 0o644
    assert f'readonly NODE_LOCK="$INSTALL_DIR/{Path(host_paths.NODE_LOCK_PATH).name}"' in NODE_SCRIPT
    assert sorted(bootstrap.NODE_UNITS) == sorted(p.name for p in UNITS.iterdir())
    for unit in bootstrap.NODE_UNITS:
        assert (tmp_path / "etc/systemd/system" / unit).read_text() == (UNITS / unit).read_text()
    env_file = tmp_path / "etc/vllm-cluster/cluster.env"
    assert env_file.read_text() == bootstrap.cluster_env(boot(1)) and env_file.stat().st_mode & 0o777 == 0o600


def test_user_data_writes_cluster_env_the_first_boot_script_and_its_library_only(tmp_path):
    write_files_of(bootstrap.node_user_data(boot(1)), tmp_path, "exec /opt/vllm-cluster/bin/vllm-cluster-first-boot\n")
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == [
        "etc/vllm-cluster/cluster.env",
        "opt/vllm-cluster/bin/vllm-cluster-first-boot",
        "opt/vllm-cluster/lib/vllm-cluster-lib.sh",
    ]
    assert (tmp_path / "etc/vllm-cluster/cluster.env").read_text() == bootstrap.cluster_env(boot(1))
    assert (tmp_path / "opt/vllm-cluster/lib/vllm-cluster-lib.sh").read_text() == LIBRARY


def test_gateway_setup_writes_the_library_and_the_gateway_command(tmp_path):
    write_files_of(
        bootstrap.gateway_setup_script(), tmp_path, "exec /opt/vllm-cluster/bin/vllm-cluster-gateway setup\n"
    )
    assert (tmp_path / "opt/vllm-cluster/lib/vllm-cluster-lib.sh").read_text() == LIBRARY
    assert (tmp_path / "opt/vllm-cluster/bin/vllm-cluster-gateway").read_text() == (
        ROOT / "scripts/gateway/vllm-cluster-gateway"
    ).read_text()


def test_gateway_user_data_runs_the_same_command_without_its_comment_lines(tmp_path):
    """EC2's 16 KiB: the first boot's copy of the gateway command drops its comment and
    blank lines, and only those; with no heredoc in it, bash runs the same code."""
    write_files_of(bootstrap.gateway_user_data(), tmp_path, "exec /opt/vllm-cluster/bin/vllm-cluster-gateway setup\n")
    assert (tmp_path / "opt/vllm-cluster/lib/vllm-cluster-lib.sh").read_text() == LIBRARY
    full = (ROOT / "scripts/gateway/vllm-cluster-gateway").read_text()
    assert not re.search(r"<<-?\s*['\"]?\w", full.replace("<<<", "")), "a heredoc: its # lines are not comments"
    compact = (tmp_path / "opt/vllm-cluster/bin/vllm-cluster-gateway").read_text()
    code = [line for line in full.splitlines()[1:] if line.strip() and not line.lstrip().startswith("#")]
    assert compact.splitlines() == [full.splitlines()[0], *code]
    assert len(compact) < len(full) * 0.8
    assert subprocess.run(["bash", "-n"], input=compact, text=True).returncode == 0


def test_user_data_fits_ec2s_limit_once_gzipped_and_unpacks_to_the_script():
    for text in (bootstrap.node_user_data(boot(1)), bootstrap.gateway_user_data()):
        packed = base64.b64decode(compress_user_data(text))
        assert len(packed) < bootstrap.USER_DATA_LIMIT_BYTES
        assert gzip.decompress(packed).decode() == text
        assert compress_user_data(text) == compress_user_data(text)  # same script, same bytes: no spurious diff


def test_rendered_scripts_are_shellcheck_clean(tmp_path):
    rendered = (
        ("node-user-data.sh", bootstrap.node_user_data(boot(0))),
        ("node-setup.sh", bootstrap.node_setup_script(boot(0))),
        ("gateway.sh", bootstrap.gateway_user_data()),
        ("gateway-setup.sh", bootstrap.gateway_setup_script()),
    )
    for name, text in rendered:
        path = tmp_path / name
        path.write_text(text)
        result = subprocess.run([SHELLCHECK, str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def test_scripts_and_renderer_agree_on_paths():
    for constant in (host_paths.CONFIG_DIR, host_paths.MODEL_ROOT, host_paths.WHEELHOUSE_ROOT, host_paths.INSTALL_DIR):
        assert constant in NODE_SCRIPT
    gateway = (ROOT / "scripts" / "gateway" / "vllm-cluster-gateway").read_text()
    assert host_paths.TLS_DIR in gateway and host_paths.NGINX_SITE in gateway
    assert f"UPSTREAM_INCLUDE={gateway_nginx.NGINX_UPSTREAM_INCLUDE}\n" in gateway


# --- systemd units --------------------------------------------------------------------


def unit(name: str) -> str:
    return (UNITS / name).read_text()


def test_ray_units_pin_the_node_ip_and_gpus_and_restart_on_failure():
    for name in ("ray-head.service", "ray-worker.service"):
        text = unit(name)
        start = re.search(r"^ExecStart=(.*?)(?<!\\)$", text, re.M | re.S).group(1)
        assert "ray start" in start and "--block" in start
        assert "--node-ip-address=${NODE_IP}" in start and "--num-gpus=${GPUS_PER_NODE}" in start
        assert "Restart=on-failure" in text and "WantedBy=multi-user.target" in text
        assert "EnvironmentFile=/etc/vllm-cluster/node.env" in text


def test_ray_and_vllm_units_lift_the_locked_memory_limit_for_efa():
    # systemd does not read /etc/security/limits.d, where the EFA installer raises it.
    for name in ("ray-head.service", "ray-worker.service", "vllm.service"):
        service = unit(name).split("[Service]", 1)[1].split("[Install]", 1)[0]
        assert "\nLimitMEMLOCK=infinity\n" in service, name
        assert int(re.search(r"\nLimitNOFILE=(\d+)\n", service).group(1)) >= 65536, name


def unit_settings(name: str, section: str = "Unit") -> dict[str, list[str]]:
    """A unit file's settings in one section: each key's values, space-separated words,
    over every line that sets it (as systemd adds up After= and RequiresMountsFor=)."""
    settings: dict[str, list[str]] = {}
    current = None
    for line in unit(name).splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == section and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).extend(value.split())
    return settings


def test_the_staging_waits_for_the_images_instance_store_setup_and_requires_its_mount():
    """Issue 34 point 3: after a stop and start the image formats and mounts the instance
    store at boot (image.NVME_SETUP_UNIT); a staging that ran before it wrote the stage
    onto the root volume, hidden once the store is mounted over it. The staging unit is
    ordered after the image's unit, and requires the mount where systemd knows it."""
    settings = unit_settings("vllm-prepare.service")
    assert image.NVME_SETUP_UNIT in settings["After"], settings
    assert settings["RequiresMountsFor"] == [image.NVME_MOUNT], settings
    # Ordering only: on hosts without the image's unit (your own hosts) nothing fails for it.
    assert image.NVME_SETUP_UNIT not in settings.get("Requires", []) + settings.get("BindsTo", [])


def test_the_worker_waits_for_the_heads_gcs_and_joins_it():
    text = unit("ray-worker.service")
    assert "ExecStartPre=+/opt/vllm-cluster/bin/vllm-cluster-node wait-gcs" in text
    assert "--address=${HEAD_IP}:${PORT_RAY_GCS}" in text


def test_vllm_unit_reads_the_key_from_a_file_and_waits_for_the_whole_cluster():
    text = unit("vllm.service")
    assert "EnvironmentFile=/etc/vllm-cluster/secrets/vllm-api.env" in text
    assert "--api-key" not in text
    assert "ExecStartPre=+/opt/vllm-cluster/bin/vllm-cluster-node wait-cluster" in text
    assert "PartOf=ray-head.service" in text


def test_vllm_is_restarted_after_any_exit_it_did_not_ask_for():
    """vLLM's server exits with status 0 when its engine dies (seen on the local hosts
    with the real engine: a pipeline stage's Ray worker lost with its raylet, the API
    server shut down cleanly). `Restart=on-failure` left it down for good, and the
    watchdog leaves a stopped unit to systemd; only an explicit stop keeps it stopped."""
    service = unit("vllm.service").split("[Service]", 1)[1].split("[Install]", 1)[0]
    assert re.search(r"^Restart=always$", service, re.M), service


def test_ray_and_vllm_run_as_the_unprivileged_service_user_and_only_their_checks_as_root():
    """Issue 33 point 3: a compromised engine gets neither root nor the node role's
    credentials. Ray (whose workers are vLLM's) and vLLM's server run as the service
    user; what must be root runs with systemd's `+` prefix: the node script's waits, and
    the rule that keeps the service user from the instance metadata service, applied
    before every start (rules do not survive a reboot)."""
    for name in ("ray-head.service", "ray-worker.service", "vllm.service"):
        service = unit(name).split("[Service]", 1)[1].split("[Install]", 1)[0]
        assert re.search(rf"^User={bootstrap.SERVICE_USER}$", service, re.M), name
        assert re.search(rf"^Group={bootstrap.SERVICE_USER}$", service, re.M), name
        pre = re.findall(r"^ExecStartPre=(.*)$", service, re.M)
        assert pre and all(line.startswith("+/opt/vllm-cluster/bin/vllm-cluster-node ") for line in pre), name
        if name.startswith("ray-"):
            assert "+/opt/vllm-cluster/bin/vllm-cluster-node guard-service" in pre, name
    # Every other node unit is the stack's own root tooling (watchdog, idle check, prepare).
    for name in bootstrap.NODE_UNITS:
        if name not in ("ray-head.service", "ray-worker.service", "vllm.service"):
            assert "User=" not in unit(name), name


def test_the_service_user_and_the_metadata_addresses_reach_the_node():
    text = bootstrap.cluster_env(boot())
    assert f"SERVICE_USER={bootstrap.SERVICE_USER}\n" in text
    assert 'INSTANCE_METADATA_ADDRESSES="169.254.169.254 fd00:ec2::254"\n' in text


def test_node_env_pins_nccl_gloo_vllm_and_ray_to_the_primary_interface():
    """setup writes node.env: every pinned name is the discovered interface and IP."""
    block = NODE_SCRIPT[NODE_SCRIPT.index("write_node_env() {") :]
    block = block[: block.index("\n}\n")]
    for line in (
        "PRIMARY_INTERFACE=$interface",
        "NODE_IP=$ip",
        "VLLM_HOST_IP=$ip",
        "NCCL_SOCKET_IFNAME=$interface",
        "GLOO_SOCKET_IFNAME=$interface",
        "RAY_AUTH_MODE=token",
        "RAY_USAGE_STATS_ENABLED=0",
    ):
        assert f"\n{line}\n" in block, line


def test_primary_interface_is_found_by_its_address_in_the_node_subnet(tmp_path):
    """The discovery the setup runs, against this machine's own loopback as the 'subnet'."""
    snippet = NODE_SCRIPT[NODE_SCRIPT.index("find_primary_interface() {") :]
    snippet = snippet[: snippet.index("\n}\n") + 3]
    script = tmp_path / "probe.sh"
    script.write_text(f"set -euo pipefail\n{snippet}\nNODE_SUBNET_CIDR=127.0.0.0/8\nfind_primary_interface\n")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["lo", "127.0.0.1"]
    script.write_text(f"set -euo pipefail\n{snippet}\nNODE_SUBNET_CIDR=192.0.2.128/25\nfind_primary_interface\n")
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert result.returncode != 0 and "expected one interface" in result.stderr


# --- gateway --------------------------------------------------------------------------


def self_signed_pair(folder):
    """(key, certificate) files of a fresh self-signed ECDSA P-256 certificate, made by openssl."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1"]
        + ["-subj", "/CN=test", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return key, cert


def test_certificate_fingerprint_matches_openssl(tmp_path):
    key, cert = self_signed_pair(tmp_path)
    expected = (
        subprocess.run(
            ["openssl", "x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256"],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .split("=", 1)[1]
    )
    assert bootstrap.certificate_fingerprint(cert.read_text()) == expected


ROUTES = api_routes.DEFAULT_GENERATION_ROUTES


def api_locations(site: str) -> dict[str, str]:
    """The API server's exact-match locations by route: each one's block."""
    return dict(re.findall(r"\n    location = (\S+) \{\n(.*?)\n    \}\n", api_server(site), re.S))


def test_nginx_site_forwards_only_the_allowlisted_routes_as_the_route_itself():
    site = gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",), rate_limit_per_second=20)
    locations = api_locations(site)
    assert list(locations) == list(ROUTES)
    assert re.search(r"location / \{\n        return 404 '\{.*\}';", site)
    # Each forwards its own route, never the path as sent (a proxy_pass without a URI).
    for route, block in locations.items():
        assert re.findall(r"proxy_pass (\S+);", block) == [f"http://vllm_api{route}"]
    assert not re.search(r"proxy_pass http://vllm_api;", site)
    assert f"client_max_body_size {gateway_nginx.MAX_REQUEST_BODY};" in site
    assert site.count("limit_req zone=vllm_api") == len(ROUTES)


def test_every_route_checks_the_key_before_anything_else_and_answers_openai_style():
    """The key is checked in the rewrite phase (`if ... return`), which runs before
    limit_req, proxy_pass and error_page hand anything on: no request without it reaches
    a gang or the waker."""
    for waker in (False, True):
        for route, block in api_locations(gateway_nginx.nginx_site("10.0.0.1", ("10.0.0.0/8",), waker=waker)).items():
            first = block.strip().splitlines()[0]
            assert first == f'if ({gateway_nginx.API_KEY_VARIABLE} = "") {{', route
            assert gateway_nginx.UNAUTHORIZED in block
    body = json.loads(re.search(r"return 401 '(.*)';", gateway_nginx.UNAUTHORIZED).group(1))
    assert body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == "invalid_request_error"
    api = api_server(gateway_nginx.nginx_site("10.0.0.1", ("10.0.0.0/8",)))
    assert "default_type application/json;" in api
    # The heads get the heads' key, not the client's.
    assert f"proxy_set_header Authorization {gateway_nginx.HEADS_AUTHORIZATION_VARIABLE};" in api


def test_only_the_routes_that_use_the_model_hand_a_request_to_the_waker():
    locations = api_locations(gateway_nginx.nginx_site("10.0.0.1", ("10.0.0.0/8",), waker=True, api_routes=ROUTES))
    wakes = [route for route, block in locations.items() if "error_page 502 504 = @vllm_waker;" in block]
    assert wakes == ["/v1/completions", "/v1/chat/completions", "/v1/responses"]
    for route in ("/health", "/v1/models"):
        assert "error_page 502 504 = @vllm_no_gang;" in locations[route]
    assert "error_page" not in api_server(gateway_nginx.nginx_site("10.0.0.1", ("10.0.0.0/8",)))


def test_the_site_serves_the_routes_the_stack_names_and_refuses_unknown_ones():
    pooling = gateway_nginx.nginx_site("10.0.0.1", ("10.0.0.0/8",), api_routes=api_routes.DEFAULT_POOLING_ROUTES)
    assert list(api_locations(pooling)) == list(api_routes.DEFAULT_POOLING_ROUTES)
    with pytest.raises(ValueError, match="/collective_rpc"):
        gateway_nginx.nginx_site("10.0.0.1", ("10.0.0.0/8",), api_routes=("/v1/models", "/collective_rpc"))


def test_a_path_nginx_would_normalise_is_refused_before_any_location():
    """nginx matches locations against the normalised path: /metrics/../v1/models would
    match /v1/models. The server's check on the path as sent refuses it first."""
    api = api_server(gateway_nginx.nginx_site("10.0.0.1", ("10.0.0.0/8",)))
    pattern = re.search(r'if \(\$request_uri ~ "(.*)"\) \{', api).group(1)
    refused = ["/metrics/../v1/models", "/v1//models", "//v1/models", "/v1/./models", "/v1/%6dodels", "/v1/models/.."]
    refused += ["/v1/models/.", "/v1/models%2F..%2Fmetrics", "/v1/models/..?x=1"]
    for path in refused:
        assert re.search(pattern, path), path
    for path in ("/v1/models", "/v1/chat/completions", "/v1/models?x=..", "/v1/models?a=b//c&d=%20", "/v1/a.b"):
        assert not re.search(pattern, path), path
    assert api.index("$request_uri") < api.index("\n    location ")


def test_the_api_keys_file_maps_each_client_key_and_holds_the_heads_key():
    current, previous, heads = "c" * 48, "p" * 40, "h" * 48
    text = bootstrap.api_keys_conf({"current": current, "previous": previous}, heads)
    assert f'    "Bearer {current}" current;\n' in text and f'    "Bearer {previous}" previous;\n' in text
    assert f'default "Bearer {heads}";' in text and f'"Bearer {heads}" ' not in text
    assert 'default "";' in text
    for bad in ('a"b' * 12, "x" * 32 + "$host", "k" * 201, "x y" * 12):
        with pytest.raises(ValueError):
            bootstrap.api_keys_conf({"current": bad}, heads)
    with pytest.raises(ValueError, match="same"):
        bootstrap.api_keys_conf({"current": current}, current)


def test_the_read_timeout_and_the_rate_limit_follow_their_settings():
    site = gateway_nginx.nginx_site(
        "10.42.128.10", ("198.51.100.7/32",), read_timeout_seconds=1800, rate_limit_per_second=50
    )
    api = site[site.index(f"listen {ports.API_HTTPS} ssl;") : site.index(f"listen {ports.DASHBOARD_HTTPS} ssl;")]
    assert "proxy_read_timeout 1800s;" in api
    assert "zone=vllm_api:10m rate=50r/s;" in site
    # The burst follows the rate: twice the per-second figure.
    assert api.count("limit_req zone=vllm_api burst=100 nodelay;") == len(ROUTES)


def test_the_default_site_keeps_ten_minutes_and_limits_no_client():
    """Issue 48: one client may use the whole stack by default (20 a second refused 212 of
    256 requests at 64 in flight); the upstream keeps a gang's batch of idle connections."""
    site = gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",))
    assert "proxy_read_timeout 600s;" in site
    assert "limit_req" not in site and "limit_conn" not in site and "error_page 429" not in site
    assert "    keepalive 256;\n" in site


def test_a_rate_limit_of_zero_leaves_the_api_unlimited():
    site = gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",), rate_limit_per_second=0)
    assert "limit_req" not in site
    assert list(api_locations(site)) == list(ROUTES)


def upstream_block(site: str, name: str) -> str:
    start = site.index(f"upstream {name} {{")
    return site[start : site.index("}", start)]


def api_server(site: str) -> str:
    return site[site.index(f"listen {ports.API_HTTPS} ssl;") : site.index(f"listen {ports.DASHBOARD_HTTPS} ssl;")]


def directives(block: str) -> list[str]:
    """The block's directives in order, without comments."""
    lines = (line.split("#", 1)[0].strip() for line in block.splitlines())
    return [line for line in lines if line.endswith(";")]


def test_the_api_pool_is_every_gang_from_the_gateways_file_and_the_dashboard_one_head():
    """The API upstream names no head: its servers are the file the gateway renders from
    `configure --gangs` and the drains. The dashboard stays on the head it was given."""
    site = gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",))
    api = directives(upstream_block(site, "vllm_api"))
    assert f"include {gateway_nginx.NGINX_UPSTREAM_INCLUDE};" in api
    assert not [line for line in api if line.startswith("server ")]
    assert directives(upstream_block(site, "ray_dashboard")) == [f"server 10.42.128.10:{ports.RAY_DASHBOARD};"]
    elsewhere = gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",), upstream_include="/tmp/pool.inc")
    assert "include /tmp/pool.inc;" in directives(upstream_block(elsewhere, "vllm_api"))


def test_the_api_pool_balances_by_requests_in_flight_with_least_conn_before_keepalive():
    """nginx docs (upstream keepalive): a balancing method other than round-robin must be
    activated before keepalive."""
    api = directives(upstream_block(gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",)), "vllm_api"))
    keepalive = next(i for i, line in enumerate(api) if line.startswith("keepalive "))
    assert "least_conn;" in api[:keepalive]


def test_the_pool_file_is_not_one_nginx_conf_includes_on_its_own():
    """Its bare `server` lines belong inside the upstream block: a file nginx.conf also
    includes at the http level (conf.d/*.conf, sites-enabled/*) would be an error."""
    distribution = Path("/etc/nginx/nginx.conf")
    globs = ["/etc/nginx/conf.d/*.conf", "/etc/nginx/sites-enabled/*"]
    if distribution.exists():
        globs += re.findall(r"^\s*include\s+(\S+);", distribution.read_text(), re.M)
    path = gateway_nginx.NGINX_UPSTREAM_INCLUDE
    assert [glob for glob in globs if fnmatch.fnmatch(path, glob)] == []
    assert path.startswith("/etc/nginx/") and not path.endswith(".conf")


def test_a_request_a_gang_could_not_serve_is_retried_on_another_within_bounds():
    api = api_server(gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",)))
    retry = re.search(r"^\s*proxy_next_upstream (.*);$", api, re.M).group(1).split()
    # Refused, reset or timed out, 502/503; and a POST (every completion) once sent.
    assert set(retry) == {"error", "timeout", "http_502", "http_503", "non_idempotent"}
    tries = int(re.search(r"proxy_next_upstream_tries (\d+);", api).group(1))
    window = int(re.search(r"proxy_next_upstream_timeout (\d+)s;", api).group(1))
    connect = int(re.search(r"proxy_connect_timeout (\d+)s;", api).group(1))
    read = int(re.search(r"proxy_read_timeout (\d+)s;", api).group(1))
    # Bounded, and a connect to a dead head leaves time for another gang...
    assert 2 <= tries <= 3 and 0 < connect < window
    # ...but a generation that ran into the read timeout is not run again elsewhere.
    assert window < read
    short = api_server(gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",), read_timeout_seconds=10))
    assert "proxy_read_timeout 10s;" in short and "proxy_next_upstream_timeout 10s;" in short


def test_the_stack_names_each_gang_and_its_heads_vllm():
    heads = {"gang0": "10.42.128.10", "gang1": "10.42.0.20"}
    assert (
        gateway_nginx.gateway_gangs(heads) == f"gang0=10.42.128.10:{ports.VLLM_API},gang1=10.42.0.20:{ports.VLLM_API}"
    )


def test_the_gateway_drops_idle_upstream_connections_before_vllm_does():
    """vLLM's server closes an idle keep-alive connection after VLLM_HTTP_TIMEOUT_KEEP_ALIVE
    seconds; nginx reusing one it has just closed answers the client 502. So nginx lets go
    first, and vllm.env states the server's figure instead of trusting vLLM's default."""
    assert gateway_nginx.GATEWAY_UPSTREAM_KEEPALIVE_SECONDS < gateway_nginx.VLLM_HTTP_KEEP_ALIVE_SECONDS
    upstream = upstream_block(gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",)), "vllm_api")
    nginx_seconds = int(re.search(r"keepalive_timeout (\d+)s;", upstream).group(1))
    env = parse_env(bootstrap.vllm_env(spec_of(), "10.0.0.1", ["10.0.0.1"]))
    assert nginx_seconds == gateway_nginx.GATEWAY_UPSTREAM_KEEPALIVE_SECONDS
    assert int(env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"]) == gateway_nginx.VLLM_HTTP_KEEP_ALIVE_SECONDS > nginx_seconds


def test_dashboard_is_for_admin_cidrs_only():
    site = gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32", "2001:db8::/48"))
    dashboard = site[site.index(f"listen {ports.DASHBOARD_HTTPS} ssl;") :]
    assert "allow 198.51.100.7/32;\n    allow 2001:db8::/48;\n    deny all;" in dashboard
    api = site[site.index(f"listen {ports.API_HTTPS} ssl;") : site.index(f"listen {ports.DASHBOARD_HTTPS} ssl;")]
    assert f":{ports.RAY_DASHBOARD}" not in api


def nodes_prometheus_server(site: str) -> str:
    start = site.index("# Prometheus's query API for the heads' Ray dashboards")
    return site[start:]


@pytest.mark.parametrize(("ip", "listen"), [("10.42.0.5", "10.42.0.5:9090"), ("fd00::5", "[fd00::5]:9090")])
def test_the_nodes_reach_prometheus_only_on_the_gateways_private_address_and_only_its_query_api(ip, listen):
    """Prometheus listens on loopback (metrics.listen_address()); what Ray's dashboards ask,
    a GET of /prometheus/api/v1/query, is all nginx passes them, on the private address and
    Prometheus's port (RAY_PROMETHEUS_HOST, metrics.ray_prometheus_host)."""
    assert "# Prometheus's query API" not in gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",))
    server = nodes_prometheus_server(
        gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",), nodes_prometheus_ip=ip)
    )
    assert re.findall(r"^\s*listen (\S+);", server, re.M) == [listen]
    assert re.findall(r"location (.*?) \{", server) == ["= /prometheus/api/v1/query", "/"]
    assert re.findall(r"proxy_pass (\S+);", server) == [f"http://127.0.0.1:{ports.PROMETHEUS}"]
    query = server[server.index("location = /prometheus/api/v1/query") : server.index("location / {")]
    assert "limit_except GET {\n            deny all;" in query
    assert "return 404;" in server[server.index("location / {") :]
    assert metrics.ray_prometheus_host(ip) + "/api/v1/query" == f"http://{listen}{metrics.NODES_QUERY_PATH}"


NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


def test_nginx_accepts_the_site(tmp_path):
    """`nginx -t` from Debian's package, with the site where the gateway puts it: in
    conf.d, included by the distribution's own nginx.conf (whose http block already
    sets ssl_protocols, as Ubuntu's does). The site with every route and the waker's
    locations, and without the waker and the rate limit."""
    if NGINX is None:
        if os.environ.get("VLLM_CLUSTER_CI"):
            pytest.fail("nginx is missing: .ci/run should have installed Debian's nginx")
        pytest.skip("Debian's nginx is not installed (apt-get install nginx; .ci/run installs it)")
    key, cert = self_signed_pair(tmp_path)
    # The pool as the gateway writes it (scripts/gateway/vllm-cluster-gateway render_upstream).
    pool = tmp_path / "vllm-cluster-upstream.inc"
    pool.write_text("server 10.42.128.10:8000 max_fails=1 fail_timeout=10s;  # gang0\nserver 10.42.0.20:8000 down;\n")
    # The keys as the gateway installs them, the longest key a stack may set among them.
    keys = tmp_path / "api-keys.conf"
    keys.write_text(bootstrap.api_keys_conf({"current": "k" * MAX_API_KEY_LENGTH, "previous": "p" * 32}, "h" * 48))
    site = tmp_path / "vllm-cluster.conf"
    site.write_text(
        gateway_nginx.nginx_site(
            "10.42.128.10",
            ("198.51.100.7/32",),
            str(cert),
            str(key),
            upstream_include=str(pool),
            api_keys_file=str(keys),
            api_routes=api_routes.KNOWN_ROUTES,
            waker=True,
            # nginx -t binds every listen address: one this machine has, as the gateway has its own.
            nodes_prometheus_ip="127.0.0.2",
        )
    )
    distribution = Path("/etc/nginx/nginx.conf").read_text()
    assert "include /etc/nginx/conf.d/*.conf;" in distribution
    main = tmp_path / "nginx.conf"

    def check(site_file: Path) -> subprocess.CompletedProcess:
        main.write_text(
            distribution.replace("include /etc/nginx/conf.d/*.conf;", f"include {site_file};").replace(
                "include /etc/nginx/sites-enabled/*;", ""
            )
        )
        return subprocess.run([NGINX, "-t", "-c", str(main)], capture_output=True, text=True)

    result = check(site)
    assert result.returncode == 0, result.stderr
    unlimited = tmp_path / "unlimited.conf"
    unlimited.write_text(
        gateway_nginx.nginx_site(
            "10.42.128.10",
            ("198.51.100.7/32",),
            str(cert),
            str(key),
            read_timeout_seconds=1800,
            rate_limit_per_second=0,
            upstream_include=str(pool),
            api_keys_file=str(keys),
        )
    )
    result = check(unlimited)
    assert result.returncode == 0, result.stderr
    broken = tmp_path / "broken.conf"
    broken.write_text(site.read_text().replace("deny all;", "deny all"))
    assert check(broken).returncode != 0


# --- aws-ofi-nccl with EFA (issue 19, point 5) ------------------------------------------


def run_write_node_env(tmp_path: Path, plugin_dirs: list[Path]) -> tuple[subprocess.CompletedProcess, Path]:
    """setup's write_node_env (run by bash) for an EFA node whose image has aws-ofi-nccl's
    library directories `plugin_dirs` (in the order cluster.env lists them)."""
    values = parse_env(bootstrap.cluster_env(boot(1)))
    values.update(EFA_ENABLED="true", OFI_NCCL_LIB_DIRS=" ".join(str(d) for d in plugin_dirs))
    cluster = tmp_path / "cluster.env"
    cluster.write_text(bootstrap.env_file(values, header="cluster.env with the test's plugin directories"))
    block = NODE_SCRIPT[NODE_SCRIPT.index("write_node_env() {") :]
    block = block[: block.index("\n}\n") + 3]
    script = f"""set -euo pipefail
{LIBRARY}
CLUSTER_ENV={cluster} NODE_ENV={tmp_path}/node.env MODEL_ROOT=/mnt/vllm-models SECRETS_DIR=/etc/vllm-cluster/secrets
ENGINE_CACHE=/var/cache/vllm-cluster/vllm
load_env "$CLUSTER_ENV"
find_primary_interface() {{ echo ens5 10.0.0.11; }}
{block}
write_node_env
"""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True), tmp_path / "node.env"


def test_with_efa_setup_fails_without_aws_ofi_nccls_plugin_naming_where_it_looked_and_the_fix(tmp_path):
    dirs = [tmp_path / "ofi-nccl/lib/x86_64-linux-gnu", tmp_path / "ofi-nccl/lib"]
    for folder in dirs:
        folder.mkdir(parents=True, exist_ok=True)  # the directories alone are not the plugin
    result, written = run_write_node_env(tmp_path, dirs)
    assert result.returncode != 0 and not written.exists()
    assert f"{dirs[0]}/{image.OFI_NCCL_PLUGIN}" in result.stderr and str(dirs[1]) in result.stderr
    assert "TCP" in result.stderr and "Fix:" in result.stderr and "efa-start-nccl" in result.stderr


def test_with_efa_setup_records_the_plugin_it_found_and_puts_its_directory_on_the_library_path(tmp_path):
    dirs = [tmp_path / "ofi-nccl/lib/x86_64-linux-gnu", tmp_path / "ofi-nccl/lib"]
    dirs[1].mkdir(parents=True)
    (dirs[1] / image.OFI_NCCL_PLUGIN).write_bytes(b"\x7fELF")
    result, written = run_write_node_env(tmp_path, dirs)
    assert result.returncode == 0, result.stderr
    env = parse_env(written.read_text())
    assert env["OFI_NCCL_PLUGIN"] == f"{dirs[1]}/{image.OFI_NCCL_PLUGIN}"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(dirs[1])
