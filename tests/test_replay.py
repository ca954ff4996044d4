"""tests/replay.py orders what it runs as Pulumi does: a command waits for every command
it depends on, also through commands that do not run again (their step still waits for
theirs), so a replay of only the changed commands keeps the program's order."""

from pulumi_mocks import run_stack
from replay import steps_of


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
