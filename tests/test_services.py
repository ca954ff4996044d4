"""The remote commands the program declares, run under the mock runtime: their
order and parallelism, their connections, what re-runs on a config change, and
that no secret leaks into a command line, the user data or a plain output."""

from __future__ import annotations

import re
from ipaddress import ip_address
from pathlib import Path

import pytest
from pulumi_mocks import booted_script, run_stack, stack_config, stack_names, unsecret, user_data_parts

from components import bootstrap, gateway_capacity, gateway_nginx, metrics, node_env, ports, versions
from components.catalog import CATALOG
from components.remote_commands import DIAL_ERROR_LIMIT, PER_DIAL_TIMEOUT_SECONDS
from tests.test_host_firewall import Firewall, firewall_sent

COMMAND = "command:remote:Command"
SECRET_SIG = "4dabf18193072939515e22adb298388d"


def unwrap(value):
    """(plain value, was it secret) from a mock-runtime input."""
    if isinstance(value, dict) and SECRET_SIG in value:
        return value["value"], True
    return value, False


def plain(value):
    return unwrap(value)[0]


@pytest.fixture(scope="module", params=stack_names())
def run(request):
    result = run_stack(request.param)
    assert result.error is None, result.error
    result.config, result.stack = stack_config(request.param), request.param
    return result


def commands(run):
    return {c.name: c for c in run.of_type(COMMAND)}


def depends_on(run, name: str) -> set[str]:
    """Every command `name` waits for, directly or through others."""
    by_urn = {r.urn: r for r in run.resources}
    named = commands(run)
    seen, todo = set(), list(named[name].dependencies)
    while todo:
        urn = todo.pop()
        resource = by_urn.get(urn)
        if resource is None or resource.name in seen:
            continue
        seen.add(resource.name)
        if resource.type == COMMAND:
            todo.extend(resource.dependencies)
    return {n for n in seen if n in named}


def node_names(run) -> list[str]:
    return [
        r.name.removeprefix("vllm-") for r in run.of_type("aws:ec2/instance:Instance") if r.name != "vllm-gateway-host"
    ]


# --- order and parallelism -------------------------------------------------------------


def test_every_node_is_set_up_and_given_its_secrets_before_ray_starts(run):
    for node in node_names(run):
        ray = "vllm-ray-head" if node == "head" else f"vllm-ray-{node}"
        assert {f"vllm-setup-{node}", f"vllm-secrets-{node}"} <= depends_on(run, ray)
        assert f"vllm-setup-{node}" in depends_on(run, f"vllm-secrets-{node}")


def test_workers_start_after_the_head_and_in_parallel():
    run = run_stack("prod", {"nodes": 4, "pipelineParallelSize": 4})
    workers = [n for n in node_names(run) if n != "head"]
    assert len(workers) == 3
    for worker in workers:
        waits_for = depends_on(run, f"vllm-ray-{worker}")
        assert "vllm-ray-head" in waits_for
        assert not any(f"vllm-ray-{other}" in waits_for for other in workers if other != worker)


def test_the_chain_cluster_ready_model_vllm_readiness(run):
    rays = {f"vllm-ray-{n}" for n in node_names(run)}
    assert rays <= depends_on(run, "vllm-cluster-ready")
    assert "vllm-cluster-ready" in depends_on(run, "vllm-model")
    assert "vllm-model" in depends_on(run, "vllm-vllm")
    # Preflight: every node's facts after the model is staged, compared on the head, before vLLM.
    facts = {f"vllm-preflight-{n}" for n in node_names(run)}
    assert {"vllm-model"} <= depends_on(run, "vllm-preflight") and facts <= depends_on(run, "vllm-preflight")
    assert "vllm-preflight" in depends_on(run, "vllm-vllm")
    assert {"vllm-vllm", "vllm-gateway-proxy"} <= depends_on(run, "vllm-readiness")
    assert {"vllm-gateway-setup", "vllm-gateway-tls"} <= depends_on(run, "vllm-gateway-proxy")


def test_every_command_waits_for_its_host(run):
    for name, command in commands(run).items():
        waits_for = {run.by_urn(urn).name for urn in command.dependencies}
        if name.startswith("vllm-gateway-"):
            # The gateway's instance and address, or (hosts) the machine's own command.
            host = {"vllm-gateway-host", "vllm-gateway-ip", "vllm-host-gateway"}
            assert host & waits_for or "vllm-gateway-setup" in depends_on(run, name), name
        elif name.startswith("vllm-setup-"):
            node = name.removeprefix("vllm-setup-")
            assert {f"vllm-{node}", f"vllm-host-{node}"} & waits_for, name


# --- connections --------------------------------------------------------------------------


def test_every_node_command_goes_through_the_gateway_with_raised_dial_limits(run):
    gateway_ip = run.outputs["gatewayPublicIp"]
    node_ips = {run.outputs["headPrivateIp"], *run.outputs["workerPrivateIps"]}
    for name, command in commands(run).items():
        connection, secret = unwrap(command.inputs["connection"])
        assert secret, f"{name}: the connection holds the private key and must be secret"
        assert connection["user"] == run.outputs["sshUser"] and connection["privateKey"] == run.outputs["sshPrivateKey"]
        assert connection["dialErrorLimit"] == DIAL_ERROR_LIMIT > 10
        assert connection["perDialTimeout"] == PER_DIAL_TIMEOUT_SECONDS
        if name.startswith(("vllm-gateway-", "vllm-login-")) or name == "vllm-host-gateway":
            assert connection["host"] == gateway_ip and "proxy" not in connection
        else:
            assert connection["host"] in node_ips, name
            proxy = connection["proxy"]
            assert proxy["host"] == gateway_ip and proxy["user"] == run.outputs["sshUser"]
            assert proxy["dialErrorLimit"] == DIAL_ERROR_LIMIT


def test_each_node_command_runs_on_its_own_node(run):
    ips = {"head": run.outputs["headPrivateIp"]}
    ips.update({f"worker-{i + 1}": ip for i, ip in enumerate(run.outputs["workerPrivateIps"])})
    for name, command in commands(run).items():
        host = plain(command.inputs["connection"])["host"]
        for node, ip in ips.items():
            if name.endswith(f"-{node}") and not name.startswith("vllm-login-"):
                assert host == ip, name
            elif name == f"vllm-login-{node}":
                # Runs on the gateway and waits there until this node accepts logins.
                assert host == run.outputs["gatewayPublicIp"] and f"--host {ip} " in plain(command.inputs["create"])
        if name in ("vllm-cluster-ready", "vllm-model", "vllm-vllm", "vllm-readiness"):
            assert host == ips["head"], name


# --- what runs ----------------------------------------------------------------------------


def cluster_env_in(script: str) -> str:
    return script.split("/etc/vllm-cluster/cluster.env <<'VLLM_CLUSTER_FILE_END'\n", 1)[1].split(
        "VLLM_CLUSTER_FILE_END", 1
    )[0]


def test_setup_tells_the_node_what_the_instance_booted_with(run):
    for node in node_names(run):
        instance = run.named(f"vllm-{node}", "aws:ec2/instance:Instance")
        booted = booted_script(instance.inputs)
        setup = commands(run)[f"vllm-setup-{node}"]
        assert setup.inputs["create"] == "sudo bash -s"
        sent, at_boot = cluster_env_in(plain(setup.inputs["stdin"])), cluster_env_in(booted)
        # Only the gateway's Prometheus for the head's Ray dashboard comes with the setup:
        # in the user data it would make every node wait for the gateway's instance.
        prometheus = re.search(rf"^RAY_PROMETHEUS_HOST=http://([\d.]+):{ports.PROMETHEUS}/prometheus$", sent, re.M)
        assert bool(prometheus) == (node == "head"), sent
        assert "RAY_PROMETHEUS_HOST=\n" in at_boot
        if prometheus:
            node_ips = {n["ip"] for g in run.outputs["gangs"] for n in g["nodes"]}
            assert prometheus.group(1) not in node_ips  # the gateway's own address
            sent = sent.replace(prometheus.group(0), "RAY_PROMETHEUS_HOST=")
        assert sent == at_boot
        assert "userDataBase64" in instance.ignore_changes


def test_setup_tells_each_node_whether_its_instance_type_has_an_instance_store(run):
    """Issue 34 point 3: where the catalog gives the type an instance store, the node
    stages its copy on the store's mount or not at all (model-stage, INSTANCE_STORE)."""
    instance_type = run.config.get("vllm-cluster:instanceType")  # none on hosts described by gpusPerNode
    has_store = instance_type is not None and CATALOG[instance_type].instance_store_gb > 0
    sent = {
        name: cluster_env_in(plain(command.inputs["stdin"]))
        for name, command in commands(run).items()
        if "/etc/vllm-cluster/cluster.env <<" in plain(command.inputs.get("stdin") or "")
    }
    assert sent
    for name, env in sent.items():
        assert re.search(r"^INSTANCE_STORE=(\w+)$", env, re.M).group(1) == str(has_store).lower(), name


def test_every_nodes_setup_brings_a_firewall_that_admits_its_gang_and_the_gateway(run):
    """Issue 33 point 5, on EC2 too (the security groups say the same, so a group
    loosened by hand still leaves Ray's ports to the gang): each node's setup writes the
    firewall with its own gang's instance IPs and the gateway's private IP, the one the
    head's dashboard reads Prometheus at; another gang's node is refused."""
    named = commands(run)
    gangs = [[node["ip"] for node in gang["nodes"]] for gang in run.outputs["gangs"]]
    head_env = cluster_env_in(plain(named["vllm-setup-head"].inputs["stdin"]))
    gateway = re.search(r"^RAY_PROMETHEUS_HOST=http://([\d.]+):", head_env, re.M).group(1)
    assert gateway not in {ip for ips in gangs for ip in ips}
    for gang in run.outputs["gangs"]:
        ips = [node["ip"] for node in gang["nodes"]]
        others = [ip for other in gangs if other != ips for ip in other]
        for node in gang["nodes"]:
            firewall = Firewall(firewall_sent(plain(named[f"vllm-setup-{node['name']}"].inputs["stdin"])))
            assert firewall.sets == {"gang": set(map(ip_address, ips)), "gateway": {ip_address(gateway)}}, node
            assert all(firewall.verdict(ip, ports.RAY_GCS) == "accept" for ip in ips)
            assert all(firewall.verdict(ip, ports.RAY_GCS) == "reject" for ip in [*others, gateway])
            assert firewall.verdict(gateway, ports.RAY_METRICS) == "accept"


def test_every_connection_pins_the_host_key_its_instance_was_given_at_boot(run):
    """Whoever answers at an instance's address during `pulumi up` would receive the TLS
    key, the tokens and the API keys: every command's connection, and its jump through the
    gateway, accepts only the key the stack put in that instance's user data (cloud-init's
    ssh_keys), whose private half travels only as a secret."""
    by_address = {run.outputs["gatewayPublicIp"]: "vllm-gateway-host"}
    by_address |= {node["ip"]: f"vllm-{node['name']}" for gang in run.outputs["gangs"] for node in gang["nodes"]}
    given = {}
    if "vllm-cluster:hostKeys" in run.config:
        # A stack of hosts: each machine's key as hostKeys gives it (tests/test_own_hosts.py).
        pinned = {line.split()[0]: " ".join(line.split()[1:3]) for line in run.config["vllm-cluster:hostKeys"]}
        given = {instance: pinned[address] for address, instance in by_address.items()}
    for instance in run.of_type("aws:ec2/instance:Instance"):
        assert unwrap(instance.inputs["userDataBase64"])[1], f"{instance.name}: its user data holds a private key"
        parts = user_data_parts(instance.inputs)
        assert "BEGIN OPENSSH PRIVATE KEY" in parts.host_private_key, instance.name
        given[instance.name] = " ".join(parts.host_public_key.split()[:2])
    assert len(set(given.values())) == len(given), "every host has a key of its own"
    for command in run.of_type(COMMAND):
        connection = unsecret(command.inputs["connection"])
        assert connection["hostKey"] == given[by_address[connection["host"]]], command.name
        if "proxy" in connection:
            assert connection["proxy"]["hostKey"] == given["vllm-gateway-host"], command.name
        if command.name.startswith("vllm-login-"):
            # The gateway's wait for the node's login probes only the node with that key.
            node_ip = re.search(r"--host (\S+) ", plain(command.inputs["create"])).group(1)
            assert f"--host-key '{given[by_address[node_ip]]}'" in plain(command.inputs["create"]), command.name
    # The operator tools pin the same keys.
    assert sorted(run.outputs["sshKnownHosts"].splitlines()) == sorted(
        f"{address} {given[instance]}" for address, instance in by_address.items()
    )
    assert "sshKnownHosts" not in run.secret_outputs  # public keys: the operator needs them plain


def test_each_node_is_dialled_only_once_the_gateway_saw_it_accept_a_login(run):
    for node in node_names(run):
        assert f"vllm-login-{node}" in depends_on(run, f"vllm-setup-{node}")
        assert "vllm-gateway-login-probe" in depends_on(run, f"vllm-login-{node}")
    probe = commands(run)["vllm-gateway-login-probe"]
    assert unwrap(probe.inputs["stdin"])[1], "the probe's private key must travel as a secret"
    assert "BEGIN OPENSSH PRIVATE KEY" in plain(probe.inputs["stdin"])
    assert plain(probe.inputs["stdin"]) != run.outputs["sshPrivateKey"], "the gateway must not get the stack's key"


def test_vllm_runs_with_the_configured_parallelism_on_the_head_ip(run):
    settings = plain(commands(run)["vllm-vllm"].inputs["stdin"])
    env = dict(line.split("=", 1) for line in settings.splitlines() if line and not line.startswith("#"))
    args = env["SERVE_ARGS"].strip('"').split()
    topology = run.outputs["topology"]
    assert args[args.index("--tensor-parallel-size") + 1] == str(topology["tensorParallelSize"])
    assert args[args.index("--pipeline-parallel-size") + 1] == str(topology["pipelineParallelSize"])
    assert args[args.index("--distributed-executor-backend") + 1] == "ray"
    assert args[args.index("--host") + 1] == run.outputs["headPrivateIp"]


def test_cluster_ready_expects_every_node_by_ip_and_every_gpu(run):
    create = commands(run)["vllm-cluster-ready"].inputs["create"]
    ips = [run.outputs["headPrivateIp"], *run.outputs["workerPrivateIps"]]
    expected = ",".join(
        f"{n}={ip}" for n, ip in zip(["head"] + [f"worker-{i}" for i in range(1, len(ips))], ips, strict=True)
    )
    gpus = sum(node["gpus"] for node in run.outputs["topology"]["nodes"])
    assert f"--expect {expected} --gpus {gpus} " in create


def test_readiness_is_a_completion_through_the_gateway_pinned_to_the_certificate(run):
    readiness = commands(run)["vllm-readiness"]
    assert "readiness --gateway " in readiness.inputs["create"]
    assert f"--host {run.outputs['gatewayPublicIp']} " in readiness.inputs["create"]
    assert plain(readiness.inputs["stdin"]) == run.outputs["tlsCertificate"]
    assert run.outputs["endpoint"] == f"https://{run.outputs['gatewayPublicIp']}/v1"


def test_the_gateway_site_points_at_the_head(run):
    site = plain(commands(run)["vllm-gateway-proxy"].inputs["stdin"])
    # With idle stop (dev sets it) nginx hands the waker what no gang could take.
    waker = bool(run.outputs.get("idleStopMinutes"))
    # The gateway's private address, as the head's readiness check is told it.
    gateway_ip = re.search(r"--gateway (\S+) ", commands(run)["vllm-readiness"].inputs["create"]).group(1)
    sized = gateway_capacity.spec_capacity(spec_of_run(run))
    assert site == gateway_nginx.nginx_site(
        run.outputs["headPrivateIp"],
        tuple(run.config["vllm-cluster:adminCidrs"]),
        waker=waker,
        nodes_prometheus_ip=gateway_ip,
        keepalive=sized.upstream_keepalive,
    )


def spec_of_run(run):
    """The stack's spec, as the program read it."""
    from cli.stack_file import readable_config
    from components.spec import load_spec

    readable, secret = readable_config(run.config)
    return load_spec(readable, stack=run.stack, secret_keys=set(secret))


def test_the_gateway_is_configured_for_the_streams_the_stack_holds(run):
    """nginx.conf's worker_connections and worker_rlimit_nofile (issue 48), from every
    declared gang's batch (components/gateway_capacity.py), on configure's line."""
    sized = gateway_capacity.spec_capacity(spec_of_run(run))
    create = plain(commands(run)["vllm-gateway-proxy"].inputs["create"])
    assert f" --connections {sized.worker_connections} --open-files {sized.open_files} " in create
    assert sized.worker_connections > 2 * 1000  # Debian's 768 reset 276 of 1,000 streams


def test_the_gateway_site_follows_the_configured_read_timeout_and_limits():
    before = run_stack("dev")
    default = plain(commands(before)["vllm-gateway-proxy"].inputs["stdin"])
    assert "limit_req" not in default and "limit_conn" not in default  # none by default
    limits = {"apiRateLimitPerSecond": 20, "apiMaxRequestsInFlightPerKey": 8, "apiMaxRequestsInFlightPerAddress": 4}
    after = run_stack("dev", {"apiReadTimeoutSeconds": 1800, **limits})
    site = plain(commands(after)["vllm-gateway-proxy"].inputs["stdin"])
    assert "proxy_read_timeout 1800s;" in site and "limit_req zone=vllm_api burst=40 nodelay;" in site
    assert "limit_conn vllm_api_keys 8;" in site and "limit_conn vllm_api_addresses 4;" in site
    assert changed_commands(before, after) == {"vllm-gateway-proxy"}


# --- day 2: what re-runs -------------------------------------------------------------------


def command_inputs(result) -> dict[str, dict]:
    return {c.name: c.inputs for c in result.of_type(COMMAND)}


def preflight_of(result) -> set[str]:
    """The preflight commands: they run again before any restart of vLLM that a new
    model or version brings."""
    return {c.name for c in result.of_type(COMMAND) if c.name.startswith("vllm-preflight")}


def changed_commands(before, after) -> set[str]:
    a, b = command_inputs(before), command_inputs(after)
    assert set(a) == set(b)
    return {name for name in a if a[name] != b[name]}


def test_the_fabric_gate_runs_on_every_node_after_ray_and_preflight_and_before_vllm(run):
    """Issue 35 point 4: a gang of several nodes measures its all-reduce once Ray has
    every node and preflight passed (after each node's copy of its stage, which would
    share the network), every node at once, and vLLM starts only after the head's gate."""
    named = commands(run)
    nodes = [name.removeprefix("vllm-setup-") for name in named if name.startswith("vllm-setup-")]
    if len(nodes) == 1:
        assert not any(name.startswith("vllm-fabric") for name in named), "a gang of one node has no fabric"
        assert "vllm-fabric" not in depends_on(run, "vllm-vllm")
        return
    measures = {f"vllm-fabric-{node}" for node in nodes}
    assert measures <= set(named)
    for name in measures:
        waits_for = depends_on(run, name)
        assert {"vllm-cluster-ready", "vllm-preflight"} | {f"vllm-ray-{n}" for n in nodes} <= waits_for, name
        # At once: no node's share waits for another's (each would wait at the rendezvous).
        assert not waits_for & measures, name
        line = plain(named[name].inputs["create"])
        assert f"fabric-measure --nodes {len(nodes)} --backend nccl --ranks-per-node {run_gpus(run)} " in line
    assert measures <= depends_on(run, "vllm-fabric")
    assert "vllm-fabric" in depends_on(run, "vllm-vllm")
    gate = named["vllm-fabric"].inputs
    # A quarter of the type's network bandwidth; hosts without a type: of gigabit Ethernet.
    instance = CATALOG.get(run.config.get("vllm-cluster:instanceType", ""))
    floor = instance.network_gbps / 8 / 4 if instance else 1 / 8 / 4
    assert f"fabric-gate --floor-gbps {floor:g} " in plain(gate["create"])
    assert plain(gate["create"]).endswith(" --efa") == (run.config.get("vllm-cluster:efa") == "true")
    # The head's gate judges the head's measurement (rank 0's): its output, as its input.
    references = run_stack(run.stack, stdout_references=True)
    assert plain(commands(references)["vllm-fabric"].inputs["stdin"]) == "@@stdout-of:vllm-fabric-head@@"


def run_gpus(run) -> int:
    if "vllm-cluster:instanceType" in run.config:
        return CATALOG[run.config["vllm-cluster:instanceType"]].gpus
    return int(run.config["vllm-cluster:gpusPerNode"])


def test_a_new_fabric_floor_judges_the_same_measurement_again_and_nothing_else():
    before = run_stack("prod")
    after = run_stack("prod", {"fabricFloorGBps": "40"})
    assert changed_commands(before, after) == {"vllm-fabric"}
    assert "--floor-gbps 40 --floor-why 'fabricFloorGBps, the stack'\"'\"'s own'" in plain(
        command_inputs(after)["vllm-fabric"]["create"]
    )


def test_the_local_hosts_lock_runs_the_gate_with_gloo_and_its_floor(tmp_path):
    """A lock whose torch is a CPU build (the local hosts') has no NCCL: one Gloo rank per
    node, held to Gloo's floor over the hosts' network."""
    run = run_stack(
        "prod",
        {
            "nodeLock": str(node_env.local_host().lock_path.relative_to(node_env.ROOT)),
            "vllmVersion": node_env.local_host_vllm_version(),
        },
    )
    named = command_inputs(run)
    assert "--backend gloo --ranks-per-node 1 " in plain(named["vllm-fabric-worker-1"]["create"])
    assert "--floor-gbps 0.03125 " in plain(named["vllm-fabric"]["create"])


def test_an_unchanged_config_re_runs_nothing():
    assert changed_commands(run_stack("prod"), run_stack("prod")) == set()


def on_every_node(run, *steps: str) -> set[str]:
    """The per-node commands `steps` (prepare, warmup, ...) of every node of the run's gang."""
    nodes = [r.name.removeprefix("vllm-setup-") for r in run.of_type(COMMAND) if r.name.startswith("vllm-setup-")]
    return {f"vllm-{step}-{node}" for step in steps for node in nodes}


def test_new_vllm_settings_restart_only_vllm():
    before = run_stack("prod")
    after = run_stack("prod", {"gpuMemoryUtilization": "0.85", "vllmExtraArgs": ["--max-num-seqs", "64"]})
    # --max-num-seqs changes the compiled graphs: a new key of the compile cache, seeded
    # (prepare, which copies nothing: the same stages) and kept (warmup) on every node; and
    # the streams the gateway holds (components/gateway_capacity.py), no vLLM restart there.
    assert changed_commands(before, after) == {"vllm-vllm", "vllm-readiness", "vllm-gateway-proxy"} | on_every_node(
        after, "prepare", "warmup"
    )


def test_new_vllm_settings_that_leave_the_graphs_alone_keep_the_same_compile_cache():
    before = run_stack("prod")
    after = run_stack("prod", {"gpuMemoryUtilization": "0.85"})
    assert changed_commands(before, after) == {"vllm-vllm", "vllm-readiness"} | on_every_node(after, "warmup")


def test_a_new_parallel_layout_restarts_only_vllm():
    before = run_stack("h100")
    after = run_stack("h100", {"tensorParallelSize": 4, "pipelineParallelSize": 4})
    # Each node copies its new stages (prepare) and keeps the new graphs (warmup).
    assert changed_commands(before, after) == {"vllm-vllm", "vllm-readiness"} | on_every_node(
        after, "prepare", "warmup"
    )
    assert "--tp 4 --pp 4" in command_inputs(after)["vllm-prepare-worker-1"]["create"]


def test_a_new_model_stages_it_and_restarts_only_vllm():
    """Also when stageVolume auto turns to the gp3 stage volume for the new model
    (test_a_model_the_stage_volume_wakes_faster_gives_it_to_new_nodes_only)."""
    before = run_stack("dev")
    after = run_stack("dev", {"model": "Qwen/Qwen2.5-7B-Instruct"})
    # dev stops when idle: the gateway's waker is told the new model's wake time (it
    # restarts the waker alone, nothing of Ray or vLLM), and each node's idle stop the
    # grace a boot whose engine never answers gets (issue 34), which follows it (here the
    # same: the 7B's wake from the stage volume gives the 1.5B's grace, at its 15 min floor).
    assert changed_commands(before, after) - on_every_node(after, "idle-stop") == {
        "vllm-model",
        "vllm-vllm",
        "vllm-readiness",
        "vllm-gateway-waker",
    } | preflight_of(after) | on_every_node(after, "prepare", "warmup")
    assert "--model Qwen/Qwen2.5-7B-Instruct " in command_inputs(after)["vllm-model"]["create"]


def test_a_model_the_stage_volume_wakes_faster_gives_it_to_new_nodes_only():
    """dev's 7B copies its ~15 GB stage from EFS for ~29 s at each wake; from the volume the
    wake is 37 s shorter, so auto chooses it: each instance declares it, under ignoreChanges
    (running nodes keep their stage where it is), and the launch template stays as it was."""
    before = run_stack("dev")
    after = run_stack("dev", {"model": "Qwen/Qwen2.5-7B-Instruct"})
    template = "aws:ec2/launchTemplate:LaunchTemplate"
    assert [t.inputs for t in after.of_type(template)] == [t.inputs for t in before.of_type(template)]
    nodes = [r for r in after.of_type("aws:ec2/instance:Instance") if r.parent_type == "vllm-cluster:index:GpuNodes"]
    assert nodes and all(n.inputs.get("ebsBlockDevices") and "ebsBlockDevices" in n.ignore_changes for n in nodes)


def test_a_hub_mirror_is_passed_to_the_model_download_only():
    before = run_stack("dev")
    after = run_stack("dev", {"hfEndpoint": "https://hf-mirror.example.com"})
    assert changed_commands(before, after) == {"vllm-model"}
    assert command_inputs(after)["vllm-model"]["create"].endswith(" --hub https://hf-mirror.example.com")


def lock_of_versions(tmp_path, vllm: str = versions.VLLM_VERSION, ray: str = versions.RAY_VERSION) -> str:
    """A lock for other versions, as tools/lock_node_env.py --vllm/--ray would write
    one: the checked-in lock with vLLM and Ray at those versions (hashes kept)."""
    text = node_env.default_lock_path().read_text()
    text = re.sub(r"(?m)^vllm==\S+", f"vllm=={vllm}", re.sub(r"(?m)^ray==\S+", f"ray=={ray}", text))
    path = tmp_path / f"node-gpu-vllm{vllm}-ray{ray}.txt"
    path.write_text(text)
    return str(path)


def test_a_new_ray_version_reinstalls_and_restarts_ray_then_everything_after_it(tmp_path):
    before = run_stack("prod")
    lock = lock_of_versions(tmp_path, ray="2.61.0")
    after = run_stack("prod", {"rayVersion": "2.61.0", "nodeLock": lock})
    changed = changed_commands(before, after)
    assert {"vllm-setup-head", "vllm-setup-worker-1", "vllm-ray-head", "vllm-ray-worker-1"} <= changed
    assert "vllm-model" not in changed and not any(name.startswith("vllm-gateway-") for name in changed)
    digest = bootstrap.lock_digest(Path(lock).read_text())
    assert plain(command_inputs(after)["vllm-ray-head"]["triggers"]) == ["2.61.0", digest]
    # The new lock goes to every node with its setup command.
    assert Path(lock).read_text() in plain(command_inputs(after)["vllm-setup-worker-1"]["stdin"])


def test_a_new_vllm_version_installs_the_new_environment_and_restarts_ray_and_vllm(tmp_path):
    # A new vLLM comes with its own locked environment (torch, NCCL, ...): every node
    # installs it, and the processes that run the old one restart, Ray's included.
    before = run_stack("prod")
    after = run_stack("prod", {"vllmVersion": "0.34.0", "nodeLock": lock_of_versions(tmp_path, vllm="0.34.0")})
    changed = changed_commands(before, after)
    setup_and_ray = {"vllm-setup-head", "vllm-setup-worker-1", "vllm-ray-head", "vllm-ray-worker-1"}
    assert setup_and_ray | {"vllm-vllm", "vllm-readiness"} | preflight_of(after) <= changed
    assert "vllm-model" not in changed and not any(name.startswith("vllm-gateway-") for name in changed)


def test_a_new_lock_of_the_same_versions_reinstalls_and_restarts_without_touching_the_model(tmp_path):
    # Same vLLM and Ray, another torch (say): an environment change all the same.
    text = node_env.default_lock_path().read_text()
    other = tmp_path / "other.txt"
    other.write_text(re.sub(r"(?m)^(urllib3==\S+)", r"\1.post1", text))
    before = run_stack("prod")
    after = run_stack("prod", {"nodeLock": str(other)})
    changed = changed_commands(before, after)
    assert {"vllm-setup-head", "vllm-setup-worker-1", "vllm-ray-head", "vllm-vllm"} <= changed
    assert "vllm-model" not in changed


def test_a_new_admin_cidr_reconfigures_only_the_gateway():
    before = run_stack("dev")
    after = run_stack("dev", {"adminCidrs": ["198.51.100.7/32", "192.0.2.0/28"]})
    assert changed_commands(before, after) == {"vllm-gateway-proxy"}


# --- Prometheus on the gateway (issue 21) -----------------------------------------------


def staged_files(script: str) -> dict[str, str]:
    """The files the metrics command's script stages, by their path on the gateway
    (bootstrap.gateway_metrics_script writes each under $staged)."""
    found = re.findall(r"install -D -m \d+ /dev/stdin \$staged(\S+) <<'(\w+)'\n(.*?)\n\2\n", script, re.S)
    return {path: body + "\n" for path, _, body in found}


def test_prometheus_gets_every_node_of_every_gang_labelled_and_its_login_as_a_hash_only():
    import json

    result = run_stack("prod", {"replicas": 2})
    assert result.error is None, result.error
    metrics_command = commands(result)["vllm-gateway-metrics"]
    script, secret = unwrap(metrics_command.inputs["stdin"])
    assert secret and metrics_command.inputs.get("logging") == "none"
    assert plain(metrics_command.inputs["create"]) == "sudo bash -s"
    assert "vllm-gateway-setup" in depends_on(result, "vllm-gateway-metrics")
    files = staged_files(script)
    ray = json.loads(files["/etc/prometheus/vllm-cluster/targets/ray.json"])
    vllm = json.loads(files["/etc/prometheus/vllm-cluster/targets/vllm.json"])
    gangs = result.outputs["gangs"]
    nodes = {(g["name"], n["name"], n["ip"]) for g in gangs for n in g["nodes"]}
    assert {(t["labels"]["gang"], t["labels"]["node"], t["targets"][0].split(":")[0]) for t in ray} == nodes
    assert all(t["targets"][0].endswith(f":{ports.RAY_METRICS}") for t in ray)
    assert [(t["labels"]["gang"], t["labels"]["role"]) for t in vllm] == [(g["name"], "head") for g in gangs]
    user, password = result.outputs["metricsLogin"].split(":", 1)
    assert password not in script
    assert files["/etc/nginx/vllm-cluster-metrics.htpasswd"].startswith(f"{user}:{{SSHA}}")
    assert script.rstrip().endswith(f"--ready-url http://127.0.0.1:{ports.PROMETHEUS}/prometheus/-/ready")


def test_no_node_can_make_prometheus_store_more_than_its_share():
    """Issue 33 point 5: one node's answer (a compromised node, a runaway label) must not
    exhaust the gateway: every job that scrapes the nodes, as the gateway receives it,
    carries a sample limit and a body size limit."""
    import yaml

    result = run_stack("prod", {"replicas": 2})
    files = staged_files(plain(commands(result)["vllm-gateway-metrics"].inputs["stdin"]))
    jobs = {job["job_name"]: job for job in yaml.safe_load(files["/etc/prometheus/prometheus.yml"])["scrape_configs"]}
    for name, job in jobs.items():
        if "file_sd_configs" in job:  # the nodes' jobs: Prometheus's own and the waker's are on loopback
            assert job["sample_limit"] == metrics.SCRAPE_SAMPLE_LIMIT, name
            assert job["body_size_limit"] == metrics.SCRAPE_BODY_SIZE_LIMIT, name
    assert {"vllm", "ray"} <= {name for name, job in jobs.items() if "sample_limit" in job}


def test_nginx_gives_the_nodes_prometheus_on_the_gateways_private_address_once_prometheus_left_it(run):
    """The site's listener for the heads' Ray dashboards takes Prometheus's port on the
    gateway's private address (the address RAY_PROMETHEUS_HOST names); the site waits for
    the metrics command, which moves Prometheus to loopback, or nginx could not bind it."""
    named = commands(run)
    site = plain(named["vllm-gateway-proxy"].inputs["stdin"])
    [listen] = re.findall(rf"^\s*listen (\S+):{ports.PROMETHEUS};", site, re.M)
    head_setup = plain(named["vllm-setup-head"].inputs["stdin"])
    told = re.search(rf"^RAY_PROMETHEUS_HOST=http://(\S+):{ports.PROMETHEUS}/prometheus$", head_setup, re.M)
    assert told and told.group(1) == listen
    assert "vllm-gateway-metrics" in depends_on(run, "vllm-gateway-proxy")


def test_more_gangs_change_the_metrics_targets_and_nothing_of_the_running_gangs():
    before = run_stack("prod", {"replicas": 2})
    after = run_stack("prod", {"replicas": 3})
    assert before.error is None and after.error is None
    a, b = command_inputs(before), command_inputs(after)
    assert a["vllm-gateway-metrics"] != b["vllm-gateway-metrics"]
    old_gangs = {name for name in a if name.startswith(("vllm-gang1", "vllm-setup-", "vllm-ray-"))}
    assert {name for name in old_gangs if a[name] != b.get(name)} == set()


# --- secrets ------------------------------------------------------------------------------


def secret_values(result, config_secrets: dict[str, str]) -> dict[str, str]:
    tls_bundle = plain(commands(result)["vllm-gateway-tls"].inputs["stdin"])
    tls_key = tls_bundle[: tls_bundle.index("-----END PRIVATE KEY-----")]
    api_keys = plain(commands(result)["vllm-gateway-api-keys"].inputs["stdin"])
    return {
        "sshPrivateKey": result.outputs["sshPrivateKey"].strip(),
        "apiKey": result.outputs["apiKey"],
        # Not an output: the heads' key lives only in the gateway's map and the heads' env.
        "headsApiKey": re.search(r'default "Bearer ([^"]+)";', api_keys).group(1),
        "probeApiKey": re.search(r'"Bearer ([^"]+)" probe;', api_keys).group(1),
        "rayToken": result.outputs["rayToken"],
        "tls private key": tls_key.split("\n", 1)[1].strip(),
        # The gateway gets only its salted hash (components/metrics.py htpasswd_line).
        "metrics password": result.outputs["metricsLogin"].split(":", 1)[1],
        **config_secrets,
    }


def _texts(value):
    value, _ = unwrap(value)
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def test_no_secret_in_a_command_line_user_data_plain_stdin_or_plain_output():
    hf_token, api_key = "hf_" + "t" * 34, "a" * 40
    result = run_stack("prod", {"hfToken": hf_token, "apiKey": api_key}, secret_keys=["hfToken", "apiKey"])
    assert result.error is None
    secrets = secret_values(result, {"hfToken": hf_token})
    assert secrets["apiKey"] == api_key

    places = {}
    for command in result.of_type(COMMAND):
        # A command line is visible to every process on the host (ps): secret or not in state.
        places[f"{command.name} create"] = plain(command.inputs["create"])
        stdin, secret = unwrap(command.inputs.get("stdin", ""))
        if not secret:
            places[f"{command.name} stdin"] = stdin
        places[f"{command.name} triggers"] = (
            "\n".join(t for t in _texts(command.inputs.get("triggers") or []) if not isinstance(t, dict))
            if not unwrap(command.inputs.get("triggers"))[1]
            else ""
        )
    for instance in result.of_type("aws:ec2/instance:Instance"):
        places[f"{instance.name} user data"] = booted_script(instance.inputs)
    for name, value in result.outputs.items():
        if name not in result.secret_outputs:
            places[f"output {name}"] = repr(value)

    for place, text in places.items():
        for secret_name, secret in secrets.items():
            assert secret not in text, f"{secret_name} appears in {place}"


def test_secrets_travel_only_on_secret_stdin_with_logging_off():
    hf_token = "hf_" + "t" * 34
    result = run_stack("dev", {"hfToken": hf_token}, secret_keys=["hfToken"])
    secrets = secret_values(result, {"hfToken": hf_token})
    carriers = {}
    for command in result.of_type(COMMAND):
        stdin, secret = unwrap(command.inputs.get("stdin", ""))
        held = [name for name, value in secrets.items() if value in (stdin or "")]
        if held:
            carriers[command.name] = held
            assert secret, f"{command.name} carries {held} on a plain stdin"
            assert command.inputs.get("logging") == "none", command.name
            assert {"stdout", "stderr"} <= set(command.additional_secret_outputs), command.name
    assert set(carriers) == {"vllm-secrets-head", "vllm-gateway-tls", "vllm-gateway-api-keys"}
    # The clients' key stays on the gateway: the head checks a key of its own.
    assert set(carriers["vllm-secrets-head"]) == {"headsApiKey", "probeApiKey", "rayToken", "hfToken"}
    assert set(carriers["vllm-gateway-api-keys"]) == {"apiKey", "headsApiKey", "probeApiKey"}


def test_workers_get_the_ray_token_and_nothing_else():
    result = run_stack("prod")
    stdin = plain(commands(result)["vllm-secrets-worker-1"].inputs["stdin"])
    assert stdin == f"RAY_AUTH_TOKEN={result.outputs['rayToken']}\n"


def test_secret_exports_are_secret():
    result = run_stack("dev")
    assert {"sshPrivateKey", "apiKey", "rayToken"} <= result.secret_outputs
    assert "tlsCertificate" not in result.secret_outputs  # public by nature: clients pin it


# --- a user's certificate ------------------------------------------------------------------

USER_CERT = "-----BEGIN CERTIFICATE-----\nTUlJQ2VydGlmaWNhdGVGb3JUZXN0cw==\n-----END CERTIFICATE-----\n"
USER_KEY = "-----BEGIN PRIVATE KEY-----\nTUlJUHJpdmF0ZUtleUZvclRlc3Rz\n-----END PRIVATE KEY-----\n"


def test_a_user_certificate_replaces_the_generated_one_and_names_the_endpoint():
    result = run_stack(
        "dev",
        {"tlsCertificate": USER_CERT, "tlsPrivateKey": USER_KEY, "endpointHostname": "llm.example.com"},
        secret_keys=["tlsPrivateKey"],
    )
    assert result.error is None, result.error
    assert result.of_type("tls:index/selfSignedCert:SelfSignedCert") == []
    assert result.outputs["endpoint"] == "https://llm.example.com/v1"
    assert result.outputs["tlsFingerprint"] == bootstrap.certificate_fingerprint(USER_CERT)
    readiness = commands(result)["vllm-readiness"]
    assert "--host llm.example.com " in readiness.inputs["create"]
    assert plain(readiness.inputs["stdin"]) == ""  # a public CA's certificate: the system store checks it
    assert plain(commands(result)["vllm-gateway-tls"].inputs["stdin"]) == USER_KEY + USER_CERT


def test_pem_blocks_stay_apart_when_the_key_lost_its_final_newline():
    """`pulumi config set --secret ...:tlsPrivateKey < key.pem` strips the last newline."""
    result = run_stack(
        "dev",
        {"tlsCertificate": USER_CERT, "tlsPrivateKey": USER_KEY.rstrip("\n"), "endpointHostname": "llm.example.com"},
        secret_keys=["tlsPrivateKey"],
    )
    bundle = plain(commands(result)["vllm-gateway-tls"].inputs["stdin"])
    assert "-----END PRIVATE KEY-----\n-----BEGIN CERTIFICATE-----" in bundle


def test_a_user_private_key_in_plain_text_is_refused_before_any_resource():
    result = run_stack(
        "dev", {"tlsCertificate": USER_CERT, "tlsPrivateKey": USER_KEY, "endpointHostname": "llm.example.com"}
    )
    assert result.error is not None and "tlsPrivateKey" in str(result.error)
    assert USER_KEY.splitlines()[1] not in str(result.error)
    assert result.resources == []


# --- replacing nodes: blue/green through the gateway's pool ------------------------------


def replaced(config: dict, instances: dict[str, str]) -> tuple[set[str], object]:
    """The commands `pulumi up` runs again when the named instances are replaced (new
    hosts at new private IPs, as a launch-template change does), and the new run."""
    before = run_stack("prod", config)
    after = run_stack("prod", config, instance_ips=instances)
    assert before.error is None and after.error is None, (before.error, after.error)
    return changed_commands(before, after), after


def test_one_gangs_pool_moves_to_a_new_head_only_after_its_vllm_served_a_completion():
    """One replica: configure (which sets the gang's address) waits for start-vllm, which
    returns after a real completion on the head; until then the old head serves. The
    readiness through the gateway comes after the switch."""
    changed, run = replaced({}, {"vllm-head": "10.0.200.1", "vllm-worker-1": "10.0.200.2"})
    assert "vllm-gateway-proxy" in changed and "vllm-readiness" in changed
    proxy = commands(run)["vllm-gateway-proxy"]
    assert plain(proxy.inputs["create"]).endswith(f" --gangs gang0=10.0.200.1:{ports.VLLM_API}")
    assert {"vllm-vllm", "vllm-preflight", "vllm-cluster-ready"} <= depends_on(run, "vllm-gateway-proxy")
    assert "vllm-gateway-proxy" in depends_on(run, "vllm-readiness")
    # What the nodes' bootstrap waits for on the gateway does not wait for the pool.
    assert "vllm-gateway-proxy" not in depends_on(run, "vllm-login-head")


def test_with_replicas_a_replaced_gang_switches_at_its_return_after_its_own_completion():
    """Two gangs, gang 1 replaced: configure runs early (the drains wait for it) and
    keeps the old head; gang 1's drain names the new head (nothing to drain at the old
    one), its return after its vLLM switches the pool to it, and readiness follows."""
    head = "10.0.200.1"
    changed, run = replaced({"replicas": 2}, {"vllm-gang1-head": head, "vllm-gang1-worker-1": "10.0.200.2"})
    address = f"{head}:{ports.VLLM_API}"
    named = commands(run)
    assert "configure --keep-old-heads --connections " in plain(named["vllm-gateway-proxy"].inputs["create"])
    assert f"--gang gang1 --address {address} " in plain(named["vllm-gang1-drain"].inputs["create"])
    assert plain(named["vllm-gang1-return"].inputs["create"]).endswith(f"return --gang gang1 --address {address}")
    assert {"vllm-gang1-drain", "vllm-gang1-return", "vllm-gang1-vllm", "vllm-gang1-readiness"} <= changed
    # Gang 0 on its own hosts restarts nothing.
    assert not {name for name in changed if name.startswith(("vllm-gang0", "vllm-vllm", "vllm-ray-head"))}
    assert "vllm-gang1-vllm" in depends_on(run, "vllm-gang1-return")
    assert "vllm-gang1-return" in depends_on(run, "vllm-gang1-readiness")
    # Every gang's return names its own head: a return is the switch, also of gang 0.
    gang0_head = plain(named["vllm-vllm"].inputs["connection"])["host"]
    assert plain(named["vllm-gang0-return"].inputs["create"]).endswith(f"--address {gang0_head}:{ports.VLLM_API}")


def test_a_replaced_gateway_is_set_up_again_at_the_same_address():
    """The Elastic IP keeps the gateway's address when its instance is replaced: the
    commands that set a gateway up would see no change of their inputs and leave the new
    one bare (no TLS, no site, no pool). They re-run with the instance."""
    run = run_stack("prod", {"replicas": 2})
    gateway_id = run.id_of(run.named("vllm-gateway-host", "aws:ec2/instance:Instance"))
    named = commands(run)
    for name in ("vllm-gateway-setup", "vllm-gateway-tls", "vllm-gateway-proxy", "vllm-gateway-login-probe"):
        assert gateway_id in [plain(t) for t in plain(named[name].inputs.get("triggers") or [])], name


def test_with_reserved_capacity_the_old_node_goes_first_and_the_preview_says_the_service_is_down():
    """A full reservation has no slot for a new node before the old one goes: no
    blue/green there. Every node is delete-before-replace and the preview says so;
    without a reservation every node is created before its old one is deleted."""
    reserved = run_stack("prod", {"capacityReservationId": "cr-0123456789abcdef0", "availabilityZone": "us-east-1b"})
    assert reserved.error is None, reserved.error
    nodes = [r for r in reserved.of_type("aws:ec2/instance:Instance") if r.name != "vllm-gateway-host"]
    assert nodes and all(node.delete_before_replace for node in nodes)
    assert any("The service is down while its nodes are replaced" in warning for warning in reserved.warnings)
    plain_run = run_stack("prod")
    nodes = [r for r in plain_run.of_type("aws:ec2/instance:Instance") if r.name != "vllm-gateway-host"]
    assert not any(node.delete_before_replace for node in nodes)
    assert not any("service is down" in warning for warning in plain_run.warnings)


# --- the stack's probe of its model (components/api_routes.py stack_probe) ------------------


@pytest.mark.parametrize(
    "extra_args, route, fields, off",
    [
        (["--runner", "pooling", "--pooler-config.task", "embed"], "/v1/embeddings", {"input": "Hello"}, "/classify"),
        (["--convert", "classify"], "/classify", {"input": "Hello"}, "/v1/embeddings"),
    ],
)
def test_a_pooling_stack_hands_its_head_a_probe_of_its_task_and_its_gateway_the_probes_route(
    extra_args, route, fields, off
):
    """vLLM serves a pooling model no /v1/completions: start-vllm is handed the probe of
    the model's task (which it keeps for readiness, the watchdog and status-facts), and
    the gateway forwards that route, not the completions."""
    import json
    import shlex

    result = run_stack("dev", {"vllmExtraArgs": extra_args, "servedModelName": "pooled"})
    assert result.error is None, result.error
    named = commands(result)
    words = shlex.split(plain(named["vllm-vllm"].inputs["create"]))
    after = words[words.index("start-vllm") + 1 :]
    sent = dict(zip(after[::2], after[1::2], strict=True))
    assert sent["--probe-route"] == route
    assert json.loads(sent["--probe-body"]) == {"model": "pooled", **fields}
    site = plain(named["vllm-gateway-proxy"].inputs["stdin"])
    assert f"location = {route} {{" in site and f"location = {off} {{" not in site
    assert "location = /v1/completions {" not in site
    # Readiness reads the probe start-vllm kept: it runs after it, and again with its settings.
    assert "vllm-vllm" in depends_on(result, "vllm-readiness")


def start_vllm_arguments(run) -> dict[str, str]:
    """What the head's vllm command hands start-vllm, by flag."""
    import shlex

    words = shlex.split(plain(commands(run)["vllm-vllm"].inputs["create"]))
    after = words[words.index("start-vllm") + 1 :]
    return dict(zip(after[::2], after[1::2], strict=True))


def test_a_generation_stack_probes_with_one_token_completion(run):
    sent = start_vllm_arguments(run)
    assert sent["--probe-route"] == "/v1/completions"
    assert sent["--probe-body"] == (
        '{"model":"'
        + (run.config.get("vllm-cluster:servedModelName") or run.config["vllm-cluster:model"])
        + '","prompt":"Hello","max_tokens":1}'
    )


def test_the_heads_start_wait_is_handed_the_planned_bound_on_a_silent_start(run):
    """Issue 34 point 5: start-vllm fails a start whose journal stays silent longer than
    the stack planned for the model (sizing.engine_start_stall_for), not after its whole
    timeout; the bound comes from the program, never from the node."""
    from cli.stack_file import readable_config
    from components import sizing
    from components.spec import load_spec

    readable, secret = readable_config(run.config)
    spec = load_spec(readable, stack=run.stack, secret_keys=set(secret))
    bound = int(start_vllm_arguments(run)["--stall-seconds"])
    assert bound == sizing.engine_start_stall_for(spec.model, spec.instance, spec.nodes)
    assert bound >= sizing.ENGINE_START_STALL_FLOOR_SECONDS
    # The plan tells the operator the same bound before `pulumi up` does.
    from cli import plan

    assert f"writes no line for {bound} s" in plan.render(plan.build_plan(run.stack))
