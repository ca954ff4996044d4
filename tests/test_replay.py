"""localhosts/replay.py orders what it runs as Pulumi does: a command waits for every command
it depends on, also through commands that do not run again (their step still waits for
theirs), so a replay of only the changed commands keeps the program's order."""

import json
import time

import pytest
from pulumi_mocks import run_stack

import localhosts.replay as replay_module
from localhosts.replay import COMMAND, Outcome, OutputClock, replay, steps_of
from localhosts.ssh_dial import DialLog


def test_only_the_changed_commands_still_wait_through_the_unchanged_ones():
    run = run_stack("prod", {"replicas": 2})
    assert run.error is None, run.error
    # gang 1's vLLM depends on its drain through its setup, Ray and preflight, which a
    # change of vLLM settings does not run again.
    only = {"vllm-gang0-drain", "vllm-gang1-drain", "vllm-vllm", "vllm-gang1-vllm", "vllm-gang0-return"}
    steps = steps_of(run, only)
    assert "vllm-gang1-drain" in steps["vllm-gang1-vllm"].after
    assert "vllm-gang0-drain" in steps["vllm-vllm"].after
    assert "vllm-gang0-drain" in steps["vllm-gang1-drain"].after
    # Nothing outside the selection is waited for: it will not run.
    assert all(set(step.after) <= only for step in steps.values())


def test_all_commands_wait_for_their_direct_dependencies():
    run = run_stack("prod")
    steps = steps_of(run)
    assert "vllm-setup-head" in steps["vllm-ray-head"].after
    assert "vllm-ray-head" in steps["vllm-ray-worker-1"].after


# --- when each line of a command's output arrived (issue 19, point 5) ------------------


def test_the_clock_times_each_line_by_its_end_and_keeps_the_streams_apart():
    clock = OutputClock()
    clock.receive("stdout", b"", at=100.0)  # the command started
    clock.receive("stderr", b"10:00 [head] setting up\n10:00 [head] mount", at=101.0)
    clock.receive("stdout", b"half a li", at=102.0)
    clock.receive("stderr", b"ing\n", at=140.0)
    clock.receive("stdout", b"ne\n", at=141.0)
    clock.close(at=150.0)
    assert clock.lines == [
        (101.0, "stderr", "10:00 [head] setting up"),
        (140.0, "stderr", "10:00 [head] mounting"),
        (141.0, "stdout", "half a line"),
    ]


def test_the_longest_silence_counts_from_the_start_and_to_the_end_and_names_the_line_before_it():
    clock = OutputClock()
    clock.receive("stdout", b"", at=0.0)
    clock.receive("stderr", b"one\n", at=20.0)
    clock.receive("stderr", b"two\n", at=95.0)
    clock.close(at=100.0)
    assert clock.longest_silence() == (75.0, "one")
    quiet_start = OutputClock()
    quiet_start.receive("stdout", b"", at=0.0)
    quiet_start.receive("stdout", b"late\n", at=61.0)
    quiet_start.close(at=62.0)
    assert quiet_start.longest_silence() == (61.0, None)
    quiet_end = OutputClock()
    quiet_end.receive("stdout", b"", at=0.0)
    quiet_end.receive("stdout", b"early\n", at=1.0)
    quiet_end.close(at=90.0)
    assert quiet_end.longest_silence() == (89.0, "early")


def test_a_command_that_never_started_has_no_silence():
    """A dial that failed opened no session: nothing was silent on the wire."""
    clock = OutputClock()
    clock.close(at=5.0)
    assert clock.longest_silence() == (0.0, None)


def test_the_session_hands_every_chunk_to_the_clock_as_it_arrives():
    """localhosts/ssh_dial.py's reading loop, on a stand-in channel that delivers output in
    chunks over time, feeds the clock with each chunk when it is read."""
    from localhosts import ssh_dial

    class Channel:
        def __init__(self):
            self.chunks = [("stdout", b"a\n", 0.0), ("stderr", b"b\n", 0.1), ("stdout", b"c\n", 0.2)]
            self.started = time.monotonic()
            self.closed = False

        def exec_command(self, command):
            pass

        def _ready(self, stream):
            due = bool(self.chunks) and time.monotonic() - self.started >= self.chunks[0][2]
            return due and self.chunks[0][0] == stream

        def recv_ready(self):
            return self._ready("stdout")

        def recv_stderr_ready(self):
            return self._ready("stderr")

        def recv(self, size):
            return self.chunks.pop(0)[1]

        recv_stderr = recv

        def exit_status_ready(self):
            return not self.chunks

        def recv_exit_status(self):
            return 0

        def sendall(self, data):
            pass

        def shutdown_write(self):
            pass

        def close(self):
            self.closed = True

    channels = []

    class Transport:
        def open_session(self, timeout):
            channels.append(Channel())
            return channels[-1]

    clock = OutputClock()
    # How many chunks the channel still held at each hand-over. Not the gaps between the
    # clock's times: in CI's niced worker the reading loop's 0.05 s naps wake up late by
    # tenths of a second, while this count does not depend on when anything ran.
    held = []

    def heard(stream, chunk):
        held.append(len(channels[0].chunks))
        clock.receive(stream, chunk)

    result = ssh_dial.Session._exec(Transport(), "true", "", 10, ssh_dial.DialLog(), heard)
    clock.close()
    assert result.stdout == "a\nc\n" and result.stderr == "b\n"
    assert [text for _, _, text in clock.lines] == ["a", "b", "c"]
    # The start before any output, then each chunk before the next one was read (a loop
    # that handed the output over at the end would show [0, 0, 0, 0]).
    assert held == [3, 2, 1, 0]
    times = [at for at, _, _ in clock.lines]
    assert clock.opened is not None and clock.opened <= times[0] <= times[1] <= times[2]


def test_a_replaced_gang_is_replayed_new_head_first_switch_after_its_vllm():
    """What localhosts/cluster.replace_nodes replays when gang 1's node gets a new IP:
    the commands whose inputs changed, in the program's order through the unchanged ones
    (the pool's configure, then gang 1's drain, its bootstrap, its vLLM, the switch, the
    check through the gateway)."""
    config = {"replicas": 2}
    before = run_stack("prod", config)
    moved = {"vllm-gang1-head": "10.0.200.1", "vllm-gang1-worker-1": "10.0.200.2"}
    after = run_stack("prod", config, instance_ips=moved)
    old = {c.name: c.inputs for c in before.of_type(COMMAND)}
    changed = {c.name for c in after.of_type(COMMAND) if old.get(c.name) != c.inputs}
    steps = steps_of(after, changed)
    assert "vllm-gateway-proxy" in steps["vllm-gang1-drain"].after
    assert "vllm-gang1-drain" in steps["vllm-setup-gang1-head"].after
    assert "vllm-gang1-vllm" in steps["vllm-gang1-return"].after
    assert "vllm-gang1-return" in steps["vllm-gang1-readiness"].after
    assert steps["vllm-gang1-return"].create.endswith("return --gang gang1 --address 10.0.200.1:8000")


def test_a_destroy_runs_each_delete_after_the_deletes_of_what_depends_on_it():
    """`pulumi destroy` of a stack of hosts: the GPU hosts' commands (reached through the
    gateway) are deleted before the gateway's, with their own connection and stdin, and
    the commands without a delete run nothing."""
    from components.bootstrap import REMOVE_COMMAND
    from localhosts.replay import delete_steps

    run = run_stack("own-hosts")
    steps = delete_steps(run)
    assert sorted(steps) == ["vllm-host-gateway", "vllm-host-head", "vllm-host-worker-1"]
    assert steps["vllm-host-gateway"].after == ("vllm-host-head", "vllm-host-worker-1")
    assert steps["vllm-host-head"].after == () and steps["vllm-host-worker-1"].after == ()
    for step in steps.values():
        assert step.create == f"sudo {REMOVE_COMMAND}"
        assert step.stdin == steps_of(run)[step.name].stdin and step.target == steps_of(run)[step.name].target


# --- a command's output as another's input (issue 33, point 3) ---------------------------


def test_a_commands_stdin_gets_the_stdout_the_commands_it_uses_printed(monkeypatch):
    """The gang head's preflight reads every node's facts from its stdin, made of the
    facts commands' stdout: `pulumi up` hands it on once they ran, and so must the replay
    (with an empty stdout every fleet preflight would find no facts)."""
    run = run_stack("prod", stdout_references=True)
    assert run.error is None, run.error
    only = {"vllm-preflight-head", "vllm-preflight-worker-1", "vllm-preflight"}
    ran = {}

    def fake_run_step(step, timeout, running=None):
        ran[step.name] = step.stdin
        printed = json.dumps({"node": step.name}) + "\n" if step.name != "vllm-preflight" else ""
        return Outcome(step, 0, printed, "", 0.0, 0.0, DialLog())

    monkeypatch.setattr(replay_module, "run_step", fake_run_step)
    monkeypatch.setattr(replay_module, "_outputs_in_state", {})
    replay(run, only=only)
    assert ran["vllm-preflight"] == (
        'head {"node": "vllm-preflight-head"}\nworker-1 {"node": "vllm-preflight-worker-1"}\n'
    )


def test_a_replay_of_only_the_changed_commands_hands_on_what_the_others_printed_last(monkeypatch):
    """As `pulumi up` hands on an unchanged command's outputs from the stack's state."""
    run = run_stack("prod", stdout_references=True)
    monkeypatch.setattr(replay_module, "_outputs_in_state", {})
    stdins = {}

    def fake_run_step(step, timeout, running=None):
        stdins[step.name] = step.stdin
        return Outcome(step, 0, f"facts of {step.name}\n", "", 0.0, 0.0, DialLog())

    monkeypatch.setattr(replay_module, "run_step", fake_run_step)
    with pytest.raises(RuntimeError, match="uses the output of vllm-preflight-head, which has never run"):
        replay(run, only={"vllm-preflight"})
    replay(run, only={"vllm-preflight-head", "vllm-preflight-worker-1"})
    replay(run, only={"vllm-preflight"})
    assert stdins["vllm-preflight"] == "head facts of vllm-preflight-head\nworker-1 facts of vllm-preflight-worker-1\n"
