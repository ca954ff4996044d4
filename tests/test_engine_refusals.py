"""What vLLM would refuse at its start, twenty minutes and a GPU bill after `pulumi up`,
refused by the spec before any resource: a model whose weights do not fit the GPUs, a
maxModelLen above the model's context, and one the KV cache cannot hold. Only where the
model's size and context are known (components/models.py); otherwise nothing changes."""

import pytest
from pulumi_mocks import run_stack, stack_names

from cli.stack_file import read_stack
from components import catalog, models, sizing
from components.spec import SpecError, load_spec

LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
BASE = {
    "model": LLAMA_70B,
    "instanceType": "p4d.24xlarge",
    "nodes": 2,
    "apiAllowedCidrs": ["203.0.113.0/24"],
    "adminCidrs": ["198.51.100.7/32"],
}


def spec_of(**changes):
    config = {**BASE, **changes}
    return load_spec({k: v for k, v in config.items() if v is not None}, stack="test", region="us-east-1")


def refused(key: str, **changes) -> str:
    with pytest.raises(SpecError) as caught:
        spec_of(**changes)
    named = [str(p) for p in caught.value.problems if p.key == key]
    assert named, f"no problem names {key}: {caught.value}"
    return named[0]


def test_a_70b_model_on_one_g6_xlarge_is_refused_with_the_numbers_the_keys_and_the_smallest_fit():
    problem = refused("model", instanceType="g6.xlarge", nodes=1)
    assert problem.startswith(f'vllm-cluster:model = "{LLAMA_70B}"')
    # The keys that decide the fit, with their values.
    for shown in ("instanceType g6.xlarge", "nodes 1", "tensorParallelSize 1", "pipelineParallelSize 1"):
        assert shown in problem, (shown, problem)
    # The numbers: plan's "weights need 131.5 GiB per GPU" against the GPU's usable memory.
    assert "131.5 GiB per GPU" in problem and "24 GiB" in problem
    # The fix: the smallest fit `plan` finds for this model and context.
    best = sizing.smallest_fit(sizing.ModelSize.of(models.lookup(LLAMA_70B), LLAMA_70B), None, None)
    assert best is not None
    assert f"instanceType {best.instance_type}" in problem.split("Fix:")[1]
    assert f"nodes {best.nodes}" in problem.split("Fix:")[1]
    assert f"tensorParallelSize {best.tp}" in problem.split("Fix:")[1]


def test_a_max_model_len_above_the_models_context_is_refused_naming_both_numbers_and_the_fix():
    problem = refused("maxModelLen", maxModelLen=1000000)
    assert "vllm-cluster:maxModelLen = 1000000" in problem
    assert "131072" in problem and LLAMA_70B in problem
    assert "Fix: pulumi config set vllm-cluster:maxModelLen 131072" in problem


def test_a_context_the_kv_cache_cannot_hold_is_refused_with_the_length_that_fits():
    """Llama 3.1 8B on one L4: the weights fit, but its own 131,072-token context does not."""
    problem = refused("maxModelLen", model=LLAMA_8B, instanceType="g6.xlarge", nodes=1)
    instance = catalog.CATALOG["g6.xlarge"]
    size = sizing.ModelSize.of(models.lookup(LLAMA_8B), LLAMA_8B)
    held = sizing.fit(size, instance, 1, 1, None, None).context_tokens
    assert 8192 < held < 131072
    assert f"{held} tokens" in problem and "131072" in problem
    fix = problem.split("Fix:")[1]
    assert "pulumi config set vllm-cluster:maxModelLen" in fix
    suggested = int(fix.split("vllm-cluster:maxModelLen")[1].split()[0].rstrip(",.;"))
    assert suggested <= held
    # ... and that length is accepted.
    assert spec_of(model=LLAMA_8B, instanceType="g6.xlarge", nodes=1, maxModelLen=suggested).max_model_len == suggested


def test_an_fp8_kv_cache_is_counted_as_vllm_counts_it():
    """65,536 tokens of Llama 3.1 8B: 8 GiB of bf16 KV cache, more than one L4 has left;
    in fp8 half of it, which fits."""
    config = {"model": LLAMA_8B, "instanceType": "g6.xlarge", "nodes": 1, "maxModelLen": 65536}
    assert "65536" in refused("maxModelLen", **config)
    assert spec_of(**config, vllmExtraArgs=["--kv-cache-dtype", "fp8"]).max_model_len == 65536


def test_a_model_outside_the_table_is_not_refused():
    spec = spec_of(model="example-org/some-70b-model", instanceType="g6.xlarge", nodes=1, maxModelLen=1000000)
    assert spec.max_model_len == 1000000


@pytest.mark.parametrize("flag", [["--quantization", "fp8"], ["--cpu-offload-gb", "100"]])
def test_flags_that_change_what_the_gpus_hold_turn_the_refusal_into_a_warning(flag):
    spec = spec_of(instanceType="g6.xlarge", nodes=1, vllmExtraArgs=flag)
    assert any(flag[0] in warning and "not checked" in warning for warning in spec.warnings), spec.warnings


def test_every_problem_is_reported_at_once_with_the_fit():
    with pytest.raises(SpecError) as caught:
        spec_of(instanceType="g6.xlarge", nodes=1, maxModelLen=1000000, adminCidrs=["0.0.0.0/0"])
    assert {"model", "maxModelLen", "adminCidrs"} <= set(caught.value.keys)


@pytest.mark.parametrize("stack", stack_names())
def test_every_stack_file_still_validates(stack):
    assert read_stack(stack).spec.model


@pytest.mark.parametrize(
    "changes, key",
    [({"model": LLAMA_70B, "maxModelLen": None}, "model"), ({"maxModelLen": 1000000}, "maxModelLen")],
    ids=["70b-on-g6.xlarge", "context-beyond-the-model"],
)
def test_the_program_declares_no_resource_for_what_vllm_would_refuse(changes, key):
    stack = "dev" if key == "model" else "prod"
    result = run_stack(stack, changes)
    assert type(result.error).__name__ == "RunError" and f"vllm-cluster:{key}" in str(result.error)
    assert result.resources == []
