"""`vllm-cluster wake --stack NAME` and `vllm-cluster stop --stack NAME`: by hand what
idle stop does by itself (idleStopMinutes, components/idle_stop.py).

wake asks the gateway's waker to start every stopped gang's instances
(`vllm-cluster-gateway wake`: its role may start only this stack's), then waits until
every gang serves; stop has every GPU node power itself off from inside
(`vllm-cluster-node stop-now`: the instance's shutdown behaviour makes EC2 stop, not
terminate, an instance that does), but for gangs the waker sees stopped already, then
waits until the waker sees every gang stopped. Both print a progress line while they
wait and exit 0 once done, 1 when the wait ran out (naming the gangs that did not get
there), 2 when the stack has no idle stop. stop asks the stack file (without
idleStopMinutes the gateway may not start instances, and nothing but the console would
start stopped ones); wake asks the gateway, whose waker is what the deployed stack has
(a stack file that just dropped the key still needs its stopped nodes started before
`pulumi up` can reach them).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from cli.cluster import Cluster, stack_outputs
from cli.stack_file import read_stack
from components import bootstrap
from components.config_keys import NAMESPACE

# How often the waker's view is read while waiting, and how often a line says so.
POLL_SECONDS = 5
PROGRESS_SECONDS = 10
# A wake: instance start, boot, Ray, the engine with its model from the cache (plan
# shows the stack's own estimate); a stop: the nodes' shutdown and EC2's stopping.
WAKE_TIMEOUT_SECONDS = 1200
STOP_TIMEOUT_SECONDS = 600
# The ssh that runs stop-now loses its connection as the node powers off: exit 255
# from ssh is the expected end of it, not a failure.
SSH_LOST = 255


def parse_power(stdout: str) -> dict[str, str]:
    """`vllm-cluster-gateway power`'s lines (`gang1 stopped 2026-...Z`) as gang -> state."""
    states = {}
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].startswith("gang"):
            states[fields[0]] = fields[1]
    return states


def progress_line(states: dict[str, str], waited: float) -> str:
    return f"after {waited:.0f} s: " + ", ".join(f"{gang} {state}" for gang, state in sorted(states.items()))


def wait_for(
    read_states: Callable[[], dict[str, str]],
    goal: str,
    timeout: float,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, dict[str, str]]:
    """Poll the waker's view until every gang is in `goal` (True) or `timeout` seconds
    passed (False); a progress line every PROGRESS_SECONDS and on every change."""
    started = clock()
    last_said, last_states = None, None
    while True:
        states = read_states()
        waited = clock() - started
        if states and all(state == goal for state in states.values()):
            say(progress_line(states, waited))
            return True, states
        if states != last_states or last_said is None or waited - last_said >= PROGRESS_SECONDS:
            say(progress_line(states, waited) if states else f"after {waited:.0f} s: no answer from the gateway yet")
            last_said, last_states = waited, states
        if waited >= timeout:
            return False, states
        sleep(POLL_SECONDS)


def _gateway_states(cluster: Cluster) -> dict[str, str]:
    result = cluster.ssh_gateway(f"sudo {bootstrap.GATEWAY_COMMAND} power")
    return parse_power(result.stdout) if result.returncode == 0 else {}


def _every_gang(cluster: Cluster, goal: str, timeout: float, say: Callable[[str], None]) -> bool:
    """Wait for the waker to see every gang in `goal`; False, naming the others, when not in time."""
    done, states = wait_for(lambda: _gateway_states(cluster), goal, timeout, say)
    if not done:
        late = sorted(gang for gang, state in states.items() if state != goal) or ["every gang (no answer)"]
        say(f"{', '.join(late)} not {goal} within {timeout:g} s (status --stack shows why)")
    return done


def _say(text: str) -> None:
    print(f"vllm-cluster: {text}", file=sys.stderr, flush=True)


# What `vllm-cluster-gateway wake` says on a gateway without a waker.
NO_WAKER = "no idle stop"


def wake(cluster: Cluster, timeout: float, say: Callable[[str], None] = _say) -> int:
    result = cluster.ssh_gateway(f"sudo {bootstrap.GATEWAY_COMMAND} wake")
    if result.returncode != 0:
        said = " ".join(result.stderr.split()) or f"exit {result.returncode}"
        say(f"the gateway's waker refused: {said}")
        return 2 if NO_WAKER in said else 1
    say("the gateway started the stopped gangs' instances; waiting until every gang serves")
    return 0 if _every_gang(cluster, "serving", timeout, say) else 1


def park(cluster: Cluster, say: Callable[[str], None] = _say) -> int:
    """Ask the gateway's waker to park the warm gangs now (`vllm-cluster-gateway park`:
    each serving warm gang is drained, its requests finishing on it, then stopped; the last
    serving gang only with none running or waiting), and say
    what it did. scripts/deploy runs it after `pulumi up`, which it woke every gang for."""
    result = cluster.ssh_gateway(f"sudo {bootstrap.GATEWAY_COMMAND} park")
    for line in result.stdout.splitlines():
        say(line)
    if result.returncode != 0:
        said = " ".join(result.stderr.split()) or f"exit {result.returncode}"
        say(f"the gateway's waker refused: {said}")
        return 2 if NO_WAKER in said else 1
    return 0


def stop(cluster: Cluster, timeout: float, say: Callable[[str], None] = _say) -> int:
    command = f"sudo {bootstrap.NODE_COMMAND} stop-now"
    # A gang that idled out already is powered off: a login to it would only time out.
    asleep = {gang for gang, state in _gateway_states(cluster).items() if state in ("stopped", "stopping")}
    for gang in sorted(asleep):
        say(f"{gang} is stopped already (the gateway's waker says so): nothing to tell its nodes")
    # Workers before their heads: a head that went first would leave its workers' Ray
    # looking for it in their last seconds, which says nothing useful in their logs.
    order = [node for gang in cluster.gangs if gang.name not in asleep for node in reversed(gang.nodes)]
    with ThreadPoolExecutor(max(1, len(order))) as pool:
        results = list(pool.map(lambda node: cluster.ssh(node, command, 60), order))
    refused = [
        f"{node.name} ({node.ip}): {' '.join(result.stderr.split()) or f'exit {result.returncode}'}"
        for node, result in zip(order, results, strict=True)
        if result.returncode not in (0, SSH_LOST)
    ]
    for line in refused:
        say(f"did not stop: {line}")
    if order:
        say("every node was told to power off; waiting until the gateway sees every gang stopped")
    if not _every_gang(cluster, "stopped", timeout, say):
        return 1
    return 1 if refused else 0


def main(args) -> int:
    spec = read_stack(args.stack, args.stack_file).spec
    if args.command == "stop" and not spec.idle_stop_minutes:
        print(
            f"vllm-cluster stop: stack {args.stack} has no idleStopMinutes, so its gateway may not start "
            f"instances and nothing but the EC2 console would start stopped ones. "
            f"Fix: pulumi config set {NAMESPACE}:idleStopMinutes 30 --stack {args.stack}, then pulumi up",
            file=sys.stderr,
        )
        return 2
    if args.command == "park" and not spec.has_warm_gangs:
        # Not an error: scripts/deploy asks every stack with idle stop, warm gangs or not.
        print(
            f"vllm-cluster park: stack {args.stack} has no warm gang (maxReplicas above replicas): nothing to park",
            file=sys.stderr,
        )
        return 0
    cluster = Cluster(stack_outputs(args.stack, args.outputs))
    try:
        if args.command == "park":
            return park(cluster)
        if args.command == "wake":
            return wake(cluster, args.timeout if args.timeout is not None else WAKE_TIMEOUT_SECONDS)
        return stop(cluster, args.timeout if args.timeout is not None else STOP_TIMEOUT_SECONDS)
    finally:
        cluster.close()
