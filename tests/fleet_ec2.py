"""EC2 for the gateway's waker on the local fleet: the test doubles of EC2's Query API and
of the instance metadata service (tests/doubles/ec2_api.py) put where the real ones are
for the gateway, so the waker (scripts/gateway/vllm-cluster-waker) runs unchanged.

- EC2's endpoint: the waker calls the one its waker.json names
  (https://ec2.us-east-1.amazonaws.com for the fleet's region). The gateway host resolves
  that name to the bridge (a line in its /etc/hosts) and trusts the double's certificate
  (a test CA in its system store, by update-ca-certificates), as it trusts Amazon's.
- IMDS: 169.254.169.254:80, an address of the bridge, reached from the gateway's network
  namespace by a route on its link (EC2's metadata service is link-local too).
- The double holds the instances the program declared (their ids as the mock runtime
  gives them, their tags as declared) and the gateway role's policy as declared; it
  starts a stopped instance by booting its host, stops a running one by an orderly
  poweroff of its host (StopInstances: "By default, this includes a graceful operating
  system (OS) shutdown", https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StopInstances.html), and reports an
  instance stopped when its host is off, unless the test pulled the plug (`pull_plug`):
  to EC2 a host that crashed is still running.
- Capacity: `no_capacity(id)` makes EC2 refuse to start the instance for want of it, as
  EC2 does (StartInstances fails, or with accepted=True takes it and puts it back to
  stopped with a StateReason), until `capacity_back(id)`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from pathlib import Path

from doubles.ec2_api import (
    NO_CAPACITY_ERROR,
    NO_CAPACITY_REASON,
    CredentialStore,
    Ec2ApiDouble,
    InstanceMetadataDouble,
    issue_test_certificate,
)

from cli.mock_runtime import MockCloud
from localhosts.fleet import Host
from localhosts.replay import COMMAND

IMDS_IP = "169.254.169.254"
INSTANCE = "aws:ec2/instance:Instance"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
WAKER_COMMAND = "vllm-gateway-waker"
CA_FILE = "usr/local/share/ca-certificates/vllm-cluster-fleet-ec2-double.crt"


def fed_waker_config(script: str) -> dict:
    """The JSON the waker command's script (components/bootstrap.py gateway_waker_script)
    hands `vllm-cluster-gateway waker-config`."""
    fed = re.search(r"waker-config <<'(\w+)'\n(.*?)\n\1\n", script, re.DOTALL)
    assert fed is not None, "the script feeds waker-config no configuration"
    return json.loads(fed.group(2))


def waker_config(run) -> dict:
    """What the program feeds the gateway's waker."""
    command = next(c for c in run.of_type(COMMAND) if c.name == WAKER_COMMAND)
    return fed_waker_config(command.inputs["stdin"])


def gateway_policy(run) -> dict:
    """The gateway role's policy document as the program declared it."""
    for policy in run.of_type(ROLE_POLICY):
        document = json.loads(policy.inputs["policy"])
        if "ec2:StartInstances" in json.dumps(document):
            return document
    raise LookupError("the program declared no policy that may start instances")


class FleetEc2:
    """The doubles for `cluster` (localhosts.cluster.ClusterUnderTest) and `run`, the
    program with idle stop (its waker's config and the gateway's policy); entered once
    the fleet is up, before the commands that start the waker run."""

    def __init__(self, cluster, run, workdir: Path):
        self.cluster, self.run, self.workdir = cluster, run, workdir
        self.fleet = cluster.fleet
        self.pulled: set[str] = set()  # hosts (by name) whose plug a test pulled
        self.started: list[str] = []  # instance ids the double started, in order
        self.stopping: set[str] = set()  # instance ids a StopInstances is powering off
        self.lock = threading.Lock()
        self.instances: dict[str, dict[str, str]] = {}
        self.names: dict[str, str] = {}

    # --- the account as the program declared it ---

    def refresh(self, run) -> dict:
        """Read the instances, their tags and the policy from `run` (the program as it
        stands now: a replacement gives a node a new id); returns the waker's config."""
        instances = {MockCloud.resource_id(INSTANCE, r.name): r.inputs.get("tags", {}) for r in run.of_type(INSTANCE)}
        self.instances.clear()
        self.instances.update(instances)
        self.names = {MockCloud.resource_id(INSTANCE, r.name): r.name for r in run.of_type(INSTANCE)}
        self.ec2.policy = gateway_policy(run)
        return waker_config(run)

    def host_of(self, instance_id: str) -> Host | None:
        """The fleet's host running the instance: by the node's IP in the stack's outputs."""
        name = self.names.get(instance_id, "").removeprefix("vllm-")
        ips = {node["name"]: node["ip"] for gang in self.cluster.run.outputs["gangs"] for node in gang["nodes"]}
        ip = ips.get(name)
        return next((host for host in self.fleet.hosts if host.ip == ip), None)

    def instance_of(self, host: Host) -> str:
        """The id of the instance the host is."""
        return next(i for i in self.names if self.host_of(i) is host)

    def state(self, instance_id: str) -> str:
        host = self.host_of(instance_id)
        if host is None:
            return "terminated"  # replaced: deleted by `pulumi up`
        up = host.process is not None and host.process.poll() is None
        if up and instance_id in self.stopping:
            return "stopping"
        self.stopping.discard(instance_id)
        return "running" if up or host.name in self.pulled else "stopped"

    def start(self, instance_id: str) -> None:
        """StartInstances of a stopped instance: its EBS root as it was, its instance store
        empty (EC2 loses instance store data when an instance stops:
        https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/InstanceStorage.html#instance-store-lifetime)."""
        host = self.host_of(instance_id)
        with self.lock:
            self.started.append(instance_id)
        # A blank store, as if never formatted: the image's unit formats and mounts it at boot.
        store = self.fleet.instance_store_disk(host)
        for entry in store.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        self.fleet.boot(host, wait=False)

    def stop(self, instance_id: str) -> None:
        """StopInstances of a running instance: its OS shuts down in order, in the
        background (EC2 answers "stopping" at once, as the double does)."""
        host = self.host_of(instance_id)
        with self.lock:
            self.stopping.add(instance_id)
        threading.Thread(target=self.fleet.power_off, args=(host,), daemon=True).start()

    def no_capacity(self, instance_id: str, accepted: bool = False) -> None:
        """EC2 has no capacity for the instance from now on: StartInstances naming it fails
        with InsufficientInstanceCapacity; with `accepted`, it takes the instance (pending)
        and puts it back to stopped with StateReason Server.InsufficientInstanceCapacity,
        its host never booted."""
        if accepted:
            self.ec2.put_back[instance_id] = NO_CAPACITY_REASON
        else:
            self.ec2.refuse_start[instance_id] = NO_CAPACITY_ERROR

    def capacity_back(self, instance_id: str) -> None:
        self.ec2.put_back.pop(instance_id, None)
        self.ec2.refuse_start.pop(instance_id, None)

    def pull_plug(self, host: Host) -> None:
        """Power the host off from outside: to EC2 a crashed instance, still running."""
        self.pulled.add(host.name)
        self.fleet.power_off(host)

    def plug_in(self, host: Host) -> None:
        self.pulled.discard(host.name)
        self.fleet.boot(host)

    # --- where the real ones are, for the gateway ---

    def __enter__(self) -> FleetEc2:
        config = waker_config(self.run)
        endpoint_name = config["endpoint"].removeprefix("https://").split("/")[0]
        ca_file, cert_file, key_file = issue_test_certificate(self.workdir, [endpoint_name])
        credentials = CredentialStore()
        self.imds = None
        network = self.fleet.network
        # IMDS has one address on every instance, so this machine holds it on one fleet's
        # bridge at a time: only the replicas fleet stops and wakes its gangs, while the
        # main fleet runs beside it (make test), and a second would fail to listen here.
        subprocess.run(["ip", "addr", "add", f"{IMDS_IP}/32", "dev", network.bridge], check=True)
        gateway = self.fleet.gateway
        subprocess.run(["ip", "-n", gateway.netns, "route", "add", f"{IMDS_IP}/32", "dev", "eth0"], check=True)
        self.imds = InstanceMetadataDouble(IMDS_IP, 80, role="vllm-gateway-role", credentials=credentials).start()
        self.ec2 = Ec2ApiDouble(
            network.bridge_ip,
            443,
            str(cert_file),
            str(key_file),
            credentials=credentials,
            policy={},
            instances=self.instances,
            state=self.state,
            start=self.start,
            stop=self.stop,
            region=config["region"],
        ).start()
        self.refresh(self.run)
        # The gateway resolves EC2's name to the double and trusts its CA, as it trusts Amazon's.
        with open(gateway.root / "etc" / "hosts", "a") as hosts:
            hosts.write(f"{network.bridge_ip} {endpoint_name}\n")
        (gateway.root / CA_FILE).write_bytes(Path(ca_file).read_bytes())
        self.fleet.ssh(gateway, "sudo update-ca-certificates >/dev/null")
        return self

    def __exit__(self, *exc) -> None:
        for server in (getattr(self, "ec2", None), self.imds):
            if server is not None:
                server.stop()
        # The address goes with the bridge, the route with the namespace; removed now
        # all the same, so a fleet torn down later leaves nothing of ours.
        subprocess.run(["ip", "addr", "del", f"{IMDS_IP}/32", "dev", self.fleet.network.bridge], capture_output=True)
