"""How resources are named and tagged.

Every taggable resource carries the same tags, so a cluster's resources can be
found (and billed) by stack in the AWS console; its Name tag is its resource name.
"""

import pulumi


def stack_tags() -> dict[str, str]:
    """The tags that say a resource is this stack's: the program finds its own resources of
    an earlier `pulumi up` by them (__main__.py's lookups before any resource)."""
    return {"vllm-cluster:project": pulumi.get_project(), "vllm-cluster:stack": pulumi.get_stack()}


def tags(name: str, **extra: str) -> dict[str, str]:
    return {"Name": name, **stack_tags(), **extra}


def renamed_from(old_name: str, **options) -> pulumi.ResourceOptions:
    """Options for a resource that was called `old_name` in stacks deployed before
    (issue 12 renamed resources so that each name says what the resource is). The
    alias is the old URN: `pulumi up` matches the live resource to the new name and
    updates it in place, and the AWS provider keeps the cloud name it generated from
    the old one (pulumi-terraform-bridge reuses an old default), so nothing is replaced.
    tests/test_program.py checks every alias against the deployed URNs."""
    return pulumi.ResourceOptions(aliases=[pulumi.Alias(name=old_name)], **options)
