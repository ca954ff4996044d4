"""vllm-cluster operator tools: `plan`, `preflight`, `status`, `wake`, `stop`, `park`. Run through
scripts/vllm-cluster from the repository root (it finds the virtualenv)."""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys


def positive_number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of billions of parameters")
    return value


def busy_hours(text: str) -> int:
    """--busy-hours: an integer from 0 to 24 (components/warm_pool_cost.py says why not)."""
    from components.warm_pool_cost import parse_busy_hours

    try:
        return parse_busy_hours(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def deployed_stack_arguments(sub: argparse.ArgumentParser) -> None:
    """What every tool that looks at a deployed stack takes: the stack, its file, its outputs."""
    sub.add_argument("--stack", required=True)
    sub.add_argument("--stack-file", help="the stack's config file (default: stacks/Pulumi.<stack>.yaml)")
    sub.add_argument(
        "--outputs", help="the stack's outputs as JSON (default: pulumi stack output --json --show-secrets)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/vllm-cluster", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    plan = commands.add_parser("plan", help="offline: resources, topology, fit, cost, time to first token")
    plan.add_argument("--stack", required=True, help="reads stacks/Pulumi.<stack>.yaml")
    plan.add_argument("--stack-file", help="the stack's config file (default: stacks/Pulumi.<stack>.yaml)")
    plan.add_argument("--json", action="store_true")
    plan.add_argument(
        "--params-b", type=positive_number, help="model size in billions of parameters (models not in the table)"
    )
    plan.add_argument("--dtype", help="weight type: bf16, fp16, fp32, fp8, int8, int4")
    plan.add_argument(
        "--busy-hours",
        type=busy_hours,
        metavar="N",
        help="maxReplicas above replicas: price a day of N hours (0-24) at maxReplicas gangs, the rest at replicas",
    )

    for name, text in (
        ("preflight", "check every node before vLLM starts"),
        ("status", "gang health of the running cluster"),
    ):
        sub = commands.add_parser(name, help=text)
        deployed_stack_arguments(sub)
        sub.add_argument("--json", action="store_true")
        if name == "status":
            sub.add_argument("--watch", action="store_true", help="refresh in place")
            sub.add_argument("--interval", type=float, default=5.0)
    for name, text in (
        ("wake", "start a stack's stopped gangs (idleStopMinutes) and wait until they serve"),
        ("stop", "power a stack's GPU nodes off now (idleStopMinutes) and wait until they are stopped"),
        ("park", "drain and stop a stack's serving warm gangs now (maxReplicas), as the stack does after pulumi up"),
    ):
        sub = commands.add_parser(name, help=text)
        deployed_stack_arguments(sub)
        if name != "park":  # the gateway parks and answers; nothing to wait for
            sub.add_argument("--timeout", type=float, help="seconds to wait (wake: 1200, stop: 600)")

    args = parser.parse_args(argv)
    end_on_hangup_and_terminate()
    # Imported after parsing, like each command's module: `--help` loads none of
    # them, and only `plan` loads the Pulumi engine.
    from cli.cluster import OutputsError
    from cli.stack_file import StackFileError

    try:
        return run_command(args)
    except (StackFileError, OutputsError) as error:
        # The tool could not look (a bad stack file, no outputs): a tool error, not a
        # verdict on the cluster, in one line and without a traceback.
        print(f"vllm-cluster {args.command}: {error}", file=sys.stderr)
        return CANNOT_LOOK[args.command]


def end_on_hangup_and_terminate() -> None:
    """A closed terminal (SIGHUP) or a kill (SIGTERM) ends the tool the way Ctrl-C does,
    through its `finally`s: the copy of the stack's SSH private key it keeps for ssh in a
    private temporary folder (cli/cluster.py Cluster) is removed, not left in /tmp by
    Python's default of dying on the spot. Exit 128+N, as a shell reports a command ended
    by signal N. A signal the caller ignores (nohup) stays ignored."""

    def end(signum: int, _frame) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGHUP, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, end)


# Exit codes for "the tool could not look": status documents 3 (unknown) for it.
CANNOT_LOOK = {"plan": 2, "preflight": 2, "status": 3, "wake": 2, "stop": 2, "park": 2}


def run_command(args: argparse.Namespace) -> int:
    if args.command == "plan":
        from cli import plan as planner

        try:
            document = planner.build_plan(
                args.stack, args.params_b, args.dtype, stack_file=args.stack_file, busy_hours=args.busy_hours
            )
        except ValueError as error:  # a model outside the table without --params-b, an unknown --dtype, --busy-hours
            print(f"vllm-cluster plan: {error}", file=sys.stderr)
            return 2
        print(
            json.dumps(document, indent=2) if args.json else planner.render(document), end="" if not args.json else "\n"
        )
        # What AWS would refuse (components/aws_contract.py): `pulumi up` fails there.
        return 1 if document["problems"] else 0
    if args.command in ("wake", "stop", "park"):
        from cli import power

        return power.main(args)
    if args.command == "preflight":
        from cli import preflight

        return preflight.main(args)
    from cli import status

    return status.main(args)


if __name__ == "__main__":
    sys.exit(main())
