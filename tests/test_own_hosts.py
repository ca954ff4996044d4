"""A stack of machines the user already has (config `hosts`): the config is checked before
anything runs, and the program declares no AWS resource, only commands on those machines,
each removing what the stack put there when it is deleted."""

from __future__ import annotations

import ipaddress
import json

import pytest
import yaml
from pulumi_mocks import run_program, run_stack, unsecret

from components import bootstrap, ports
from components.config_keys import CONFIG_KEYS
from components.spec import CREATED_INSTANCE_KEYS, SpecError, load_spec
from components.topology import node_name
from tests.test_host_firewall import Firewall, firewall_sent

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE=\n-----END OPENSSH PRIVATE KEY-----\n"
# Each machine's own SSH host key (hostKeys), for every address the tests name.
HOST_KEYS = [
    "203.0.113.10 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDtNZh+iepw+R/bZZsPOkGlXZwaezlOQ66cB4tCRkUM2",
    "gw.example.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBUBrf/9iAR9jVSSl2cxFHsBE4LnMyBYFfZk/liF0o+N",
    "llm.example.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJVxh7C6A/RJwUgmQfPkiV6rPztvOx8gM34K1zxSraiR",
    "192.0.2.11 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDeAUm1s5OMqQCTnSI//UN+oTAJfqy2hLcGpFCBG2f0j",
    "192.0.2.12 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBf6g9SHnu0hzOa55o+BgjWHbrDjC9k4R8wJblBBGx3d",
    "192.0.2.13 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMyDmsiEx4xntpUtfpUYZDlADBWlpBh32OxtNnJoPB3c",
    "192.0.2.21 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHP2BS0SO3Pdn1vzxZZ8Y1xIpkJoxKwqsn8q4jBZRcRu",
    "192.0.2.22 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAsYrqdYq1AHlnTdHo6l3IzdhDvraKUhKwSDV3S4et4F",
]
HOSTS = {
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "gpusPerNode": 1,
    "gpuMemoryGiB": 24,
    "hosts": ["192.0.2.11,192.0.2.12", "192.0.2.21,192.0.2.22"],
    "gatewayHost": "203.0.113.10",
    "gatewayPrivateIp": "192.0.2.10",
    "sshUser": "admin",
    "sshPrivateKey": KEY,
    "modelCacheDir": "/srv/vllm-models",
    "apiAllowedCidrs": ["203.0.113.0/24"],
    "adminCidrs": ["198.51.100.7/32"],
    "hostKeys": HOST_KEYS,
}
DEFAULTS = {key.name: key.default for key in CONFIG_KEYS if not key.required}


def spec_of(**changes):
    config = {**HOSTS, **changes}
    return load_spec(
        {k: v for k, v in config.items() if v is not None},
        stack="test",
        region="us-east-1",
        secret_keys={"sshPrivateKey"},
    )


def problems_of(**changes) -> list[str]:
    with pytest.raises(SpecError) as caught:
        spec_of(**changes)
    return [str(problem) for problem in caught.value.problems]


# --- the config --------------------------------------------------------------------------


def test_hosts_give_the_gangs_and_every_other_key_keeps_its_default():
    spec = load_spec({**DEFAULTS, **HOSTS}, stack="test", region="us-east-1", secret_keys={"sshPrivateKey"})
    own = spec.own_hosts
    assert own.gangs == (("192.0.2.11", "192.0.2.12"), ("192.0.2.21", "192.0.2.22"))
    assert (spec.nodes, spec.replicas, spec.tensor_parallel_size, spec.pipeline_parallel_size) == (2, 2, 1, 2)
    assert (own.gateway_address, own.gateway_private_ip, own.ssh_user) == ("203.0.113.10", "192.0.2.10", "admin")
    assert own.ssh_private_key.reveal() == KEY and own.model_cache_dir == "/srv/vllm-models"
    assert spec.efa is False and spec.gpus_per_node == 1 and spec.instance.gpu_memory_gib == 24


def test_a_catalog_type_describes_the_hosts_gpus():
    spec = spec_of(gpusPerNode=None, gpuMemoryGiB=None, instanceType="g5.12xlarge", hosts=["192.0.2.11"])
    assert spec.gpus_per_node == 4 and spec.tensor_parallel_size == 4 and spec.nodes == 1


def test_a_host_listed_twice_is_refused():
    (problem,) = problems_of(hosts=["192.0.2.11,192.0.2.12", "192.0.2.12,192.0.2.13"])
    assert "vllm-cluster:hosts" in problem and "192.0.2.12 twice" in problem and "Fix:" in problem


def test_gangs_of_different_sizes_are_refused():
    (problem,) = problems_of(hosts=["192.0.2.11,192.0.2.12", "192.0.2.21"])
    assert "gangs of 1 and 2 hosts" in problem and "Fix:" in problem


def test_an_address_that_is_no_ip_is_refused_naming_its_item():
    (problem,) = problems_of(hosts=["192.0.2.11", "gpu-box"])
    assert 'item 1 holds "gpu-box"' in problem and "hosts[1]" in problem


@pytest.mark.parametrize(
    "key, value",
    [
        ("vpcId", "vpc-0abc12345def67890"),
        ("availabilityZone", "us-east-1a"),
        ("capacityReservationId", "cr-0123456789abcdef0"),
        ("rootVolumeGiB", 300),
        ("amiId", "ami-0123456789abcdef0"),
        ("gatewayInstanceType", "t3.medium"),
        ("placementGroupName", "my-group"),
        ("modelCacheFileSystemId", "fs-0123456789abcdef0"),
    ],
)
def test_keys_of_created_instances_are_refused_with_hosts(key, value):
    problems = problems_of(**{key: value})
    assert any(p.startswith(f"vllm-cluster:{key} = ") and "creates none" in p and "config rm" in p for p in problems)


def test_every_created_instance_key_is_a_key_of_the_contract():
    assert set(CREATED_INSTANCE_KEYS) <= set(DEFAULTS)


def test_efa_on_is_refused_with_hosts():
    (problem,) = problems_of(efa="true")
    assert problem.startswith("vllm-cluster:efa = ") and "attached at launch" in problem


def test_nodes_or_replicas_that_contradict_hosts_are_refused():
    problems = problems_of(nodes=3, replicas=4)
    assert len(problems) == 2 and all("contradicts hosts, which lists 2 gang(s) of 2 host(s)" in p for p in problems)


@pytest.mark.parametrize(
    "changes, key, words",
    [
        ({"sshPrivateKey": None}, "sshPrivateKey", "is needed with hosts"),
        ({"sshPrivateKey": "hunter2"}, "sshPrivateKey", "is needed with hosts"),
        ({"modelCacheDir": None}, "modelCacheDir", "shared file system"),
        ({"modelCacheDir": "srv/models"}, "modelCacheDir", "absolute path"),
        ({"modelCacheDir": "/mnt/vllm-models"}, "modelCacheDir", "own mount point"),
        ({"gatewayHost": None}, "gatewayHost", "is needed with hosts"),
        ({"gatewayHost": "gw.example.com", "gatewayPrivateIp": None}, "gatewayPrivateIp", "DNS name"),
        ({"gatewayPrivateIp": "192.0.2.11"}, "gatewayPrivateIp", "a machine of its own"),
        ({"gpusPerNode": None}, "gpusPerNode", "not set"),
        ({"gpuMemoryGiB": 0}, "gpuMemoryGiB", "not set"),
        ({"instanceType": "g5.12xlarge"}, "gpusPerNode", "instanceType is set"),
        ({"sshUser": "root; reboot"}, "sshUser", "login name"),
    ],
)
def test_what_hosts_need_is_refused_naming_the_key_and_the_fix(changes, key, words):
    problems = problems_of(**changes)
    assert any(p.startswith(f"vllm-cluster:{key} = ") and words in p and "Fix:" in p for p in problems), problems


def test_a_plain_text_ssh_key_is_refused_and_never_shown():
    with pytest.raises(SpecError) as caught:
        load_spec(HOSTS, stack="test", region="us-east-1", secret_keys=set())
    (problem,) = [str(p) for p in caught.value.problems]
    assert "sshPrivateKey" in problem and "--secret" in problem and "b3BlbnNz" not in problem


@pytest.mark.parametrize("key", ["gatewayHost", "sshPrivateKey", "modelCacheDir", "sshUser", "gatewayPrivateIp"])
def test_keys_of_own_hosts_are_refused_without_hosts(key):
    config = {
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "instanceType": "g6.xlarge",
        "apiAllowedCidrs": ["203.0.113.0/24"],
        "adminCidrs": ["198.51.100.7/32"],
        key: HOSTS[key],
    }
    with pytest.raises(SpecError) as caught:
        load_spec(config, stack="test", secret_keys={key})
    (problem,) = [str(p) for p in caught.value.problems]
    assert problem.startswith(f"vllm-cluster:{key} = ") and "hosts lists none" in problem


def test_without_hosts_instance_type_is_still_required():
    config = {"model": "Qwen/Qwen2.5-7B-Instruct", "apiAllowedCidrs": ["203.0.113.0/24"], "adminCidrs": []}
    with pytest.raises(SpecError) as caught:
        load_spec({**config, "adminCidrs": ["198.51.100.7/32"]}, stack="test")
    assert [p.key for p in caught.value.problems] == ["instanceType"]


# --- the program -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run():
    result = run_program(HOSTS, stack="own", secret_keys=["sshPrivateKey"])
    assert result.error is None, result.error
    return result


def test_no_aws_resource_is_declared_and_nothing_is_looked_up(run):
    assert [r.type for r in run.resources if r.type.startswith("aws:")] == []
    assert run.invokes == []
    assert {"modelCacheFileSystemId", "availabilityZone"}.isdisjoint(run.outputs)
    assert run.outputs["modelCacheDir"] == "/srv/vllm-models"


def hosts_of(run) -> dict:
    return {r.name: r for r in run.of_type("command:remote:Command") if r.name.startswith("vllm-host-")}


def test_one_command_per_machine_whose_delete_removes_what_the_stack_put_there(run):
    hosts = hosts_of(run)
    nodes = [f"vllm-host-{node_name(i, g)}" for g in range(2) for i in range(2)]
    assert sorted(hosts) == sorted(["vllm-host-gateway", *nodes])
    for host in hosts.values():
        assert host.inputs["delete"] == f"sudo {bootstrap.REMOVE_COMMAND}"
        # Another machine in its place replaces the command: its delete runs on the old one.
        assert host.inputs["triggers"] == [unsecret(host.inputs["connection"])["host"]]
        assert f"install -D -m 0755 /dev/stdin {bootstrap.REMOVE_COMMAND}" in unsecret(host.inputs["stdin"])
    gateway = unsecret(hosts["vllm-host-gateway"].inputs["connection"])
    assert (gateway["host"], gateway["user"], "proxy" in gateway) == ("203.0.113.10", "admin", False)
    assert unsecret(gateway["privateKey"]) == KEY


def test_a_gpu_hosts_command_runs_its_user_data_through_the_gateway(run):
    host = hosts_of(run)["vllm-host-gang1-worker-1"]
    connection = unsecret(host.inputs["connection"])
    assert (connection["host"], connection["user"], connection["proxy"]["host"]) == (
        "192.0.2.22",
        "admin",
        "203.0.113.10",
    )
    script = unsecret(host.inputs["stdin"])
    env = script.split(f"{bootstrap.CLUSTER_ENV} <<'VLLM_CLUSTER_FILE_END'\n", 1)[1].split("VLLM_CLUSTER_FILE_END", 1)[
        0
    ]
    values = dict(line.split("=", 1) for line in env.splitlines() if "=" in line and not line.startswith("#"))
    assert values["NODE_SUBNET_CIDR"] == "192.0.2.22/32"  # its primary interface: the one with its address
    assert values["HEAD_IP"] == "192.0.2.21" and values["LOGIN_USER"] == "admin"
    assert values["MODEL_CACHE_SHARED_DIR"] == "/srv/vllm-models" and values["EFA_ENABLED"] == "false"
    assert script.rstrip().endswith(f"exec {bootstrap.FIRST_BOOT_COMMAND}")
    assert KEY not in script


def test_the_services_start_after_their_machine_and_log_in_as_ssh_user(run):
    by_urn = {r.urn: r for r in run.resources}
    commands = {r.name: r for r in run.of_type("command:remote:Command")}
    setup = commands["vllm-setup-gang1-worker-1"]
    assert "vllm-host-gang1-worker-1" in {by_urn[u].name for u in setup.dependencies if u in by_urn}
    assert unsecret(setup.inputs["connection"])["user"] == "admin"
    login = commands["vllm-login-gang1-worker-1"]
    assert f"--host 192.0.2.22 --host-key '{key_of('192.0.2.22')}' --user admin " in unsecret(login.inputs["create"])
    gateway_setup = commands["vllm-gateway-setup"]
    assert "vllm-host-gateway" in {by_urn[u].name for u in gateway_setup.dependencies if u in by_urn}


def test_each_hosts_firewall_admits_its_own_gang_and_the_gateway_on_the_hosts_network_only(run):
    """Issue 33 point 5: the hosts have no security group. Each GPU host's setup command
    brings it a firewall (tests/test_host_firewall.py) that admits its gang's hosts and the
    gateway at gatewayPrivateIp, the address it connects from, on Ray's and vLLM's ports:
    not the other gang, not the gateway's public address. The addresses are the stack's
    config, in the command, not anything a host wrote."""
    commands = {r.name: r for r in run.of_type("command:remote:Command")}
    gangs = (("192.0.2.11", "192.0.2.12"), ("192.0.2.21", "192.0.2.22"))
    for gang, ips in enumerate(gangs):
        others = [ip for other in gangs if other != ips for ip in other]
        for index in range(len(ips)):
            setup = commands[f"vllm-setup-{node_name(index, gang)}"]
            firewall = Firewall(firewall_sent(unsecret(setup.inputs["stdin"])))
            assert firewall.sets == {
                "gang": {ipaddress.ip_address(ip) for ip in ips},
                "gateway": {ipaddress.ip_address("192.0.2.10")},
            }
            for port in (ports.VLLM_API, ports.RAY_METRICS, ports.RAY_GCS, ports.RAY_NODE_MANAGER):
                assert all(firewall.verdict(ip, port) == "accept" for ip in ips), port
                assert all(firewall.verdict(ip, port) == "reject" for ip in [*others, "203.0.113.10"]), port
            assert firewall.verdict("192.0.2.10", ports.VLLM_API) == "accept"
            assert firewall.verdict("192.0.2.10", ports.RAY_GCS) == "reject"
        # The host's own command (its user data) carries none: setup brings it.
        assert bootstrap.FIREWALL_FILE not in unsecret(hosts_of(run)[f"vllm-host-{node_name(0, gang)}"].inputs["stdin"])


def key_of(address: str) -> str:
    """The key hostKeys gives `address`, as pulumi-command's host_key takes it."""
    return next(" ".join(line.split()[1:3]) for line in HOST_KEYS if line.split()[0] == address)


def test_every_connection_and_its_jump_pin_the_host_keys_the_user_gave(run):
    """Whoever answers at a host's address gets the stack's secrets unless the connection
    knows the host's key: every command's connection pins the key hostKeys gives its host,
    and its jump the gateway's."""
    for command in run.of_type("command:remote:Command"):
        connection = unsecret(command.inputs["connection"])
        assert connection["hostKey"] == key_of(connection["host"]), command.name
        if "proxy" in connection:
            assert connection["proxy"]["host"] == "203.0.113.10", command.name
            assert connection["proxy"]["hostKey"] == key_of("203.0.113.10"), command.name
    # The operator tools pin the same keys.
    assert run.outputs["sshKnownHosts"] == "".join(line + "\n" for line in HOST_KEYS)


@pytest.mark.parametrize(
    "host_keys, fragment",
    [
        (None, "has no key for 203.0.113.10, 192.0.2.11, 192.0.2.12, 192.0.2.21, 192.0.2.22"),
        ([line for line in HOST_KEYS if not line.startswith("192.0.2.21 ")], "has no key for 192.0.2.21:"),
        (["192.0.2.11 ssh-ed25519 AAAAnotbase64!"], "item 0: the ssh-ed25519 key"),
        (["|1|abc=|def= ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKYOUwo2FQ"], "run ssh-keyscan without -H"),
        (["192.0.2.11 ssh-dss AAAAB3NzaC1kc3MAAACBAP"], "key type ssh-dss is not one of"),
    ],
    ids=["missing", "one-host-missing", "not-base64", "hashed", "dsa"],
)
def test_hosts_without_a_usable_host_key_are_refused_naming_the_key_and_the_fix(host_keys, fragment):
    (problem,) = problems_of(hostKeys=host_keys)
    assert "vllm-cluster:hostKeys" in problem and fragment in problem, problem
    assert "ssh-keyscan" in problem and "pulumi config set --path 'vllm-cluster:hostKeys[0]'" in problem, problem


def test_host_keys_without_hosts_are_refused():
    with pytest.raises(SpecError) as caught:
        load_spec(
            {"model": "Qwen/Qwen2.5-7B-Instruct", "instanceType": "g5.12xlarge", "hostKeys": HOST_KEYS[:1]},
            stack="test",
            region="us-east-1",
        )
    assert any("vllm-cluster:hostKeys" in str(p) and "hosts lists none" in str(p) for p in caught.value.problems)


def test_the_outputs_name_the_users_machines_and_keep_the_key_secret(run):
    assert run.outputs["endpoint"] == "https://203.0.113.10/v1"
    assert run.outputs["gatewayPublicIp"] == "203.0.113.10"
    assert run.outputs["headPrivateIp"] == "192.0.2.11" and run.outputs["workerPrivateIps"] == ["192.0.2.12"]
    assert [g["nodes"][0]["ip"] for g in run.outputs["gangs"]] == ["192.0.2.11", "192.0.2.21"]
    assert "admin@203.0.113.10" in run.outputs["sshCommand"]
    assert {"sshPrivateKey", "apiKey", "rayToken", "metricsLogin"} <= run.secret_outputs


def test_a_gateway_known_by_name_gets_a_certificate_for_that_name():
    result = run_program({**HOSTS, "gatewayHost": "llm.example.com"}, stack="own", secret_keys=["sshPrivateKey"])
    assert result.error is None, result.error
    (certificate,) = result.of_type("tls:index/selfSignedCert:SelfSignedCert")
    assert certificate.inputs.get("dnsNames") == ["llm.example.com"] and not certificate.inputs.get("ipAddresses")
    assert result.outputs["endpoint"] == "https://llm.example.com/v1"


def test_the_example_stack_file_is_a_stack_of_hosts_at_documentation_addresses():
    import ipaddress

    from pulumi_mocks import STACKS_DIR

    config = yaml.safe_load((STACKS_DIR / "Pulumi.own-hosts.yaml").read_text())["config"]
    documentation = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")]
    addresses = [ip for gang in config["vllm-cluster:hosts"] for ip in gang.split(",")]
    addresses += [config["vllm-cluster:gatewayHost"], config["vllm-cluster:gatewayPrivateIp"]]
    assert all(any(ipaddress.ip_address(a) in n for n in documentation) for a in addresses), addresses
    assert set(config["vllm-cluster:sshPrivateKey"]) == {"secure"}
    result = run_stack("own-hosts")
    assert result.error is None and not [r for r in result.resources if r.type.startswith("aws:")]
    assert json.dumps(result.outputs["gangs"])


# --- the secrets of a stack that runs for real (make local) --------------------------------


def test_with_real_crypto_every_stack_draws_its_own_api_key_and_ray_tokens_and_keeps_them():
    """make local's API key and Ray tokens are a real stack's: drawn from the system's
    randomness, not derived from their names, and kept for the stack's next run."""
    config = dict(HOSTS)
    first_store, second_store = {}, {}
    first = run_program(config, stack="own", secret_keys=["sshPrivateKey"], real_crypto=True, key_store=first_store)
    again = run_program(config, stack="own", secret_keys=["sshPrivateKey"], real_crypto=True, key_store=first_store)
    other = run_program(config, stack="own", secret_keys=["sshPrivateKey"], real_crypto=True, key_store=second_store)
    names = ("apiKey", "rayToken", "metricsLogin")
    assert [first.outputs[n] for n in names] == [again.outputs[n] for n in names]
    for name in names:
        assert first.outputs[name] != other.outputs[name], name
    assert len(first.outputs["apiKey"]) == 48 and first.outputs["apiKey"].isalnum()
    derived = run_program(config, stack="own", secret_keys=["sshPrivateKey"])
    assert derived.outputs["apiKey"] not in (first.outputs["apiKey"], other.outputs["apiKey"])


def test_warm_gangs_are_refused_with_hosts_which_nothing_can_start():
    """maxReplicas keeps gangs stopped for the gateway to start through EC2 (issue 36)."""
    problems = problems_of(maxReplicas=3)
    assert [p for p in problems if p.startswith("vllm-cluster:maxReplicas = 3")] == [
        next(p for p in problems if "nothing can start machines of your own" in p)
    ]
    assert spec_of(maxReplicas=2).max_replicas == 2  # hosts lists 2 gangs: as many as replicas
