"""Tags every taggable resource carries, so a cluster's resources can be found
(and billed) by stack in the AWS console."""

import pulumi


def tags(name: str, **extra: str) -> dict[str, str]:
    return {
        "Name": name,
        "vllm-cluster:project": pulumi.get_project(),
        "vllm-cluster:stack": pulumi.get_stack(),
        **extra,
    }
