"""How long the program takes under Pulumi's mock runtime for the largest graph the
catalog allows a user to ask for: 16 x p5.48xlarge, each with 32 EFA interfaces.

    make bench          (or: venv/bin/python bench/bench_program_mocks.py [--nodes 16] [--runs 5])

Prints the resource count, the first run (which includes importing pulumi_aws)
and the median of the warm runs. The program's own budget is well under 10 s.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--instance-type", default="p5.48xlarge")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    config = {
        "model": "meta-llama/Llama-3.1-405B-Instruct",
        "instanceType": args.instance_type,
        "nodes": args.nodes,
        "tensorParallelSize": 8,
        "pipelineParallelSize": args.nodes,
        "efa": "true",
        "apiAllowedCidrs": ["203.0.113.0/24"],
        "adminCidrs": ["198.51.100.7/32"],
        "aws:region": "us-east-1",
    }
    started = time.perf_counter()
    from cli.mock_runtime import run_program  # imports pulumi and pulumi_aws, part of a cold run

    timings = []
    for _ in range(args.runs):
        begin = time.perf_counter()
        result = run_program(config, stack="bench")
        timings.append(time.perf_counter() - begin)
        if result.error is not None:
            raise SystemExit(f"the program failed: {result.error}")
    cold = timings[0] + (time.perf_counter() - started - sum(timings))
    interfaces = len(result.of_type("aws:ec2/launchTemplate:LaunchTemplate")[0].inputs["networkInterfaces"])
    warm = statistics.median(timings[1:]) if len(timings) > 1 else timings[0]
    print(
        f"mock program, {args.nodes} x {args.instance_type}: {len(result.resources)} resources, "
        f"{interfaces} interfaces per node; cold run {cold:.2f} s (with imports), "
        f"warm median {warm:.2f} s over {len(timings) - 1} runs"
    )


if __name__ == "__main__":
    main()
