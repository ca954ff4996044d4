"""`vllm-cluster wake` and `stop` (cli/power.py): what they ask of the gateway and the
nodes, how they wait, and that a stack without idle stop is refused before anything."""

from __future__ import annotations

import dataclasses
import subprocess
from types import SimpleNamespace

import pytest

from cli import power
from cli.cluster import OutputsError, gangs_of
from components import bootstrap
from tests.test_status import BASE_OUTPUTS, GANG1_IPS, IPS, SPEC, gangs_output


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_waiting_ends_when_every_gang_reaches_the_goal_and_says_each_change():
    views = iter([{"gang0": "stopped", "gang1": "stopped"}] * 2 + [{"gang0": "waking", "gang1": "waking"}] * 3)
    views = [*views, {"gang0": "serving", "gang1": "waking"}, {"gang0": "serving", "gang1": "serving"}]
    said, clock = [], Clock()
    done, states = power.wait_for(iter(views).__next__, "serving", 600, said.append, clock, clock.sleep)
    assert done and states == {"gang0": "serving", "gang1": "serving"}
    assert said[0] == "after 0 s: gang0 stopped, gang1 stopped"
    assert "after 10 s: gang0 waking, gang1 waking" in said
    assert said[-1] == "after 30 s: gang0 serving, gang1 serving"


def test_waiting_gives_up_after_the_timeout_with_a_line_every_ten_seconds():
    said, clock = [], Clock()
    done, states = power.wait_for(lambda: {"gang0": "waking"}, "serving", 30, said.append, clock, clock.sleep)
    assert not done and states == {"gang0": "waking"}
    assert said == [f"after {t} s: gang0 waking" for t in (0, 10, 20, 30)]


def test_the_power_lines_are_read_as_the_gateway_prints_them():
    assert power.parse_power("gang0 serving -\ngang1 stopped 2026-12-02T12:00:00Z\nnoise\n") == {
        "gang0": "serving",
        "gang1": "stopped",
    }


class Cluster:
    def __init__(self, gateway_answers):
        self.gangs = gangs_of({**BASE_OUTPUTS, "gangs": gangs_output(IPS, GANG1_IPS)})
        self.asked, self.gateway_answers = [], list(gateway_answers)

    def ssh(self, node, command, timeout=60):
        self.asked.append((node.ip, command))
        # The node powers off under the session: ssh loses its connection.
        return subprocess.CompletedProcess([], power.SSH_LOST, "", "Connection closed by remote host")

    def ssh_gateway(self, command, timeout=30):
        self.asked.append(("gateway", command))
        return subprocess.CompletedProcess([], 0, self.gateway_answers.pop(0), "")


def test_stop_tells_every_node_workers_first_and_waits_for_the_gateway_to_see_them_stopped(monkeypatch):
    monkeypatch.setattr(power.time, "sleep", lambda seconds: None)
    cluster = Cluster(
        [
            "gang0 serving -\ngang1 serving -\n",
            "gang0 stopping -\ngang1 serving -\n",
            "gang0 stopped x\ngang1 stopped y\n",
        ]
    )
    said = []
    assert power.stop(cluster, 60, said.append) == 0
    stop_now = f"sudo {bootstrap.NODE_COMMAND} stop-now"
    told = [ip for ip, command in cluster.asked if command == stop_now]
    assert sorted(told) == sorted(IPS + GANG1_IPS)
    assert told.index(IPS[1]) < told.index(IPS[0]) and told.index(GANG1_IPS[2]) < told.index(GANG1_IPS[0])
    assert said[-1].endswith("gang0 stopped, gang1 stopped")


def test_stop_leaves_alone_a_gang_that_stopped_already_and_waits_for_the_others(monkeypatch):
    """A gang that idled out earlier is powered off: a login to it would only time out
    (and its node be reported as not stopped)."""
    monkeypatch.setattr(power.time, "sleep", lambda seconds: None)
    cluster = Cluster(["gang0 serving -\ngang1 stopped 2026-12-02T12:00:00Z\n", "gang0 stopped x\ngang1 stopped y\n"])
    said = []
    assert power.stop(cluster, 60, said.append) == 0
    told = [ip for ip, command in cluster.asked if command == f"sudo {bootstrap.NODE_COMMAND} stop-now"]
    assert sorted(told) == sorted(IPS)
    assert "gang1 is stopped already" in said[0], said


def test_wake_asks_the_gateways_waker_then_waits_for_every_gang_to_serve(monkeypatch):
    monkeypatch.setattr(power.time, "sleep", lambda seconds: None)
    cluster = Cluster(["", "gang0 waking -\ngang1 waking -\n", "gang0 serving -\ngang1 serving -\n"])
    said = []
    assert power.wake(cluster, 60, said.append) == 0
    assert cluster.asked[0] == ("gateway", f"sudo {bootstrap.GATEWAY_COMMAND} wake")
    assert not [a for a in cluster.asked if a[0] != "gateway"], "wake logged in to a node"


def test_stop_on_a_stack_without_idle_stop_is_refused_naming_the_key_before_any_login(monkeypatch, capsys):
    command = "stop"
    monkeypatch.setattr(power, "read_stack", lambda stack, stack_file: SimpleNamespace(spec=SPEC))

    def no_outputs(*args):
        raise AssertionError("read the stack's outputs (about to log in) for a stack without idle stop")

    monkeypatch.setattr(power, "stack_outputs", no_outputs)
    args = SimpleNamespace(command=command, stack="t", stack_file=None, outputs=None, timeout=None)
    assert power.main(args) == 2
    err = capsys.readouterr().err
    assert "no idleStopMinutes" in err and "pulumi config set vllm-cluster:idleStopMinutes" in err


def test_a_stack_with_idle_stop_goes_on_to_its_outputs(monkeypatch):
    spec = dataclasses.replace(SPEC, idle_stop_minutes=30)
    monkeypatch.setattr(power, "read_stack", lambda stack, stack_file: SimpleNamespace(spec=spec))
    reached = []

    def outputs(stack, outputs_file):
        reached.append(stack)
        raise OutputsError("no outputs here")

    monkeypatch.setattr(power, "stack_outputs", outputs)
    with pytest.raises(OutputsError):
        power.main(SimpleNamespace(command="wake", stack="t", stack_file=None, outputs=None, timeout=None))
    assert reached == ["t"]


def test_wake_on_a_gateway_without_a_waker_says_so_and_exits_2(monkeypatch):
    """wake asks the deployed gateway, not the stack file: a stack whose file dropped the key
    may still have stopped nodes, and a gateway without a waker says it has none."""
    cluster = Cluster([])
    cluster.ssh_gateway = lambda command, timeout=30: subprocess.CompletedProcess(
        [], 1, "", "vllm-cluster-gateway: wake: no idle stop on this gateway (no /etc/vllm-cluster/waker.json)"
    )
    said = []
    assert power.wake(cluster, 60, said.append) == 2
    assert "no idle stop" in said[0]


def test_park_asks_the_gateway_and_relays_what_it_parked(monkeypatch):
    cluster = Cluster(["gang1: parked (drained, StopInstances i-1)\n"])
    said = []
    assert power.park(cluster, said.append) == 0
    assert cluster.asked == [("gateway", f"sudo {bootstrap.GATEWAY_COMMAND} park")]
    assert said == ["gang1: parked (drained, StopInstances i-1)"]


def test_park_that_the_gateway_refuses_fails_saying_why():
    cluster = Cluster([])
    cluster.ssh_gateway = lambda command, timeout=30: subprocess.CompletedProcess([], 1, "", "waker not running\n")
    said = []
    assert power.park(cluster, said.append) == 1
    assert said == ["the gateway's waker refused: waker not running"]


def test_park_on_a_stack_without_warm_gangs_has_nothing_to_do_and_logs_in_nowhere(monkeypatch, capsys):
    """scripts/deploy asks every stack with idle stop to park: one without warm gangs answers
    at once, from its stack file."""
    spec = dataclasses.replace(SPEC, idle_stop_minutes=30)
    monkeypatch.setattr(power, "read_stack", lambda stack, stack_file: SimpleNamespace(spec=spec))

    def no_outputs(*args):
        raise AssertionError("read the stack's outputs (about to log in) for a stack without warm gangs")

    monkeypatch.setattr(power, "stack_outputs", no_outputs)
    assert power.main(SimpleNamespace(command="park", stack="t", stack_file=None, outputs=None)) == 0
    assert "has no warm gang" in capsys.readouterr().err


def test_park_on_a_warm_pool_stack_goes_to_the_gateway(monkeypatch):
    spec = dataclasses.replace(SPEC, idle_stop_minutes=30, replicas=1, max_replicas=2)
    monkeypatch.setattr(power, "read_stack", lambda stack, stack_file: SimpleNamespace(spec=spec))
    monkeypatch.setattr(power, "stack_outputs", lambda stack, outputs_file: {})
    parked = []
    monkeypatch.setattr(power, "Cluster", lambda outputs: SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(power, "park", lambda cluster: parked.append(cluster) or 0)
    assert power.main(SimpleNamespace(command="park", stack="t", stack_file=None, outputs=None)) == 0
    assert len(parked) == 1
