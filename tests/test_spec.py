"""Validation of the stack config: every bad value is refused before anything is
declared, with an error that names the key, shows the value and says what to do."""

import datetime
import json
import re

import pytest
import yaml

from components import idle_stop, image, node_env, versions
from components.config_keys import CONFIG_KEYS
from components.spec import SpecError, existing_vpc_problems, load_spec

GOOD = {
    "model": "meta-llama/Llama-3.1-70B-Instruct",
    "instanceType": "p4d.24xlarge",
    "nodes": 2,
    "apiAllowedCidrs": ["203.0.113.0/24"],
    "adminCidrs": ["198.51.100.7/32"],
}


def spec_of(**changes):
    config = {**GOOD, **changes}
    return load_spec({k: v for k, v in config.items() if v is not None}, stack="test", region="us-east-1")


def problems_of(**changes) -> SpecError:
    with pytest.raises(SpecError) as caught:
        spec_of(**changes)
    return caught.value


def test_good_config_derives_parallelism_efa_and_versions():
    spec = spec_of()
    assert (spec.tensor_parallel_size, spec.pipeline_parallel_size) == (8, 2)
    assert spec.efa is True  # the type supports EFA and there are two nodes
    assert spec.needs_placement_group
    assert (spec.vllm_version, spec.ray_version) == (versions.VLLM_VERSION, versions.RAY_VERSION)
    assert spec.warnings == ()


def test_pulumi_yaml_not_set_defaults_mean_derive():
    """Pulumi fills declared defaults in; "", 0 and auto must behave as unset."""
    spec = spec_of(
        tensorParallelSize="0",
        pipelineParallelSize=0,
        efa="auto",
        vllmVersion="",
        hfToken="",
        apiKey="",
        maxModelLen="0",
        gpuMemoryUtilization="",
        amiId="",
        vpcId="",
        publicSubnetId="",
        privateSubnetId="",
    )
    assert (spec.tensor_parallel_size, spec.pipeline_parallel_size, spec.efa) == (8, 2, True)
    assert spec.hf_token is None and spec.api_key is None and spec.max_model_len is None
    assert spec.existing_network is None and spec.ami_id is None


def test_single_small_node_has_no_efa_and_no_placement_group():
    # A model one L4 holds: the 70B of GOOD does not fit it (tests/test_engine_refusals.py).
    spec = spec_of(model="Qwen/Qwen2.5-1.5B-Instruct", instanceType="g6.xlarge", nodes=1)
    assert (spec.tensor_parallel_size, spec.pipeline_parallel_size, spec.efa) == (1, 1, False)
    assert not spec.needs_placement_group


def test_several_nodes_without_efa_is_a_warning_not_an_error():
    spec = spec_of(efa="false")
    assert spec.efa is False
    assert any("without EFA" in warning for warning in spec.warnings)


def test_strings_as_pulumi_passes_them_are_parsed():
    spec = spec_of(
        nodes="2",
        apiAllowedCidrs='["203.0.113.0/24", "2001:db8::/48"]',
        retainModelCache="true",
        gpuMemoryUtilization="0.9",
    )
    assert spec.nodes == 2 and spec.retain_model_cache is True
    assert spec.api_allowed_cidrs == ("203.0.113.0/24", "2001:db8::/48")
    assert spec.gpu_memory_utilization == pytest.approx(0.9)


CERT = "-----BEGIN CERTIFICATE-----\nTUlJQ2VydA==\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nTUlJS2V5\n-----END PRIVATE KEY-----\n"

BAD_CONFIGS = [
    # (what is wrong, changes, the key the error must name, a phrase it must contain)
    ("model missing", {"model": None}, "model", "required"),
    ("instance type missing", {"instanceType": None}, "instanceType", "required"),
    ("unknown instance type", {"instanceType": "p9.huge"}, "instanceType", "p5.48xlarge"),
    ("zero nodes", {"nodes": 0}, "nodes", "at least 1"),
    ("nodes not a number", {"nodes": "two"}, "nodes", "whole number"),
    (
        "TP x PP short of the GPUs",
        {"tensorParallelSize": 8, "pipelineParallelSize": 1},
        "pipelineParallelSize",
        "pipelineParallelSize 2",
    ),
    ("TP x PP beyond the GPUs", {"tensorParallelSize": 8, "pipelineParallelSize": 4}, "pipelineParallelSize", "= 16"),
    (
        "TP across nodes",
        {"tensorParallelSize": 16, "pipelineParallelSize": 1},
        "tensorParallelSize",
        "stays inside a node",
    ),
    ("TP that splits a node unevenly", {"tensorParallelSize": 3}, "tensorParallelSize", "divide"),
    ("negative TP", {"tensorParallelSize": -1}, "tensorParallelSize", "at least 1"),
    ("negative PP", {"pipelineParallelSize": -2}, "pipelineParallelSize", "at least 1"),
    ("EFA on a type without it", {"instanceType": "g6.xlarge", "nodes": 1, "efa": "true"}, "efa", "no EFA"),
    ("efa not a boolean", {"efa": "sometimes"}, "efa", "true or false"),
    ("malformed API CIDR", {"apiAllowedCidrs": ["203.0.113.0/33"]}, "apiAllowedCidrs", "not a CIDR"),
    ("CIDR with host bits", {"adminCidrs": ["198.51.100.7/24"]}, "adminCidrs", "198.51.100.0/24"),
    ("API open to the world", {"apiAllowedCidrs": ["0.0.0.0/0"]}, "apiAllowedCidrs", "allowPublicApi"),
    ("API open to the IPv6 world", {"apiAllowedCidrs": ["::/0"]}, "apiAllowedCidrs", "allowPublicApi"),
    ("admin open to the world", {"adminCidrs": ["0.0.0.0/0"]}, "adminCidrs", "whole internet"),
    (
        "admin open to the world even when the API may be",
        {"adminCidrs": ["::/0"], "allowPublicApi": True},
        "adminCidrs",
        "whole internet",
    ),
    (
        "admin open to the world in two halves",
        {"adminCidrs": ["0.0.0.0/1", "128.0.0.0/1"]},
        "adminCidrs",
        "whole internet",
    ),
    (
        "API open to the IPv6 world in pieces",
        {"apiAllowedCidrs": ["::/1", "8000::/2", "c000::/2"]},
        "apiAllowedCidrs",
        "whole internet",
    ),
    ("no admin CIDR", {"adminCidrs": []}, "adminCidrs", "at least one"),
    ("API CIDRs missing", {"apiAllowedCidrs": None}, "apiAllowedCidrs", "required"),
    ("CIDRs not a list", {"adminCidrs": "198.51.100.7/32"}, "adminCidrs", "list"),
    ("model with a semicolon", {"model": "org/model;reboot"}, "model", "';'"),
    ("model with a dollar", {"model": "org/$(id)"}, "model", "'$'"),
    ("model with backticks", {"model": "org/`id`"}, "model", "'`'"),
    ("model with a quote", {"model": "org/it's"}, "model", '"\'"'),
    ("model with a pipe", {"model": "org/a|b"}, "model", "'|'"),
    ("model with an ampersand", {"model": "org/a&b"}, "model", "'&'"),
    ("model with a newline", {"model": "org/a\nb"}, "model", "'\\n'"),
    ("model with a space", {"model": "org/a b"}, "model", "' '"),
    ("served name with a semicolon", {"servedModelName": "llama;id"}, "servedModelName", "';'"),
    ("extra argument with a dollar", {"vllmExtraArgs": ["--max-num-seqs", "$(id)"]}, "vllmExtraArgs", "'$'"),
    ("extra argument with a space", {"vllmExtraArgs": ["--max-num-seqs 64"]}, "vllmExtraArgs", "own item"),
    (
        "extra argument that sets TP",
        {"vllmExtraArgs": ["--tensor-parallel-size=4"]},
        "vllmExtraArgs",
        "tensorParallelSize",
    ),
    (
        "extra argument that puts the key on a command line",
        {"vllmExtraArgs": ["--api-key", "x"]},
        "vllmExtraArgs",
        "never a command line",
    ),
    ("short API key", {"apiKey": "too-short"}, "apiKey", "32 characters"),
    ("API key with a quote", {"apiKey": "a" * 40 + "'"}, "apiKey", "letters, digits"),
    ("API key longer than the gateway holds", {"apiKey": "a" * 201}, "apiKey", "longer than 200"),
    ("previous key without the new one", {"previousApiKey": "p" * 40}, "previousApiKey", "apiKey is not"),
    ("previous key that is the key", {"apiKey": "k" * 40, "previousApiKey": "k" * 40}, "previousApiKey", "same"),
    ("short previous key", {"apiKey": "k" * 40, "previousApiKey": "old"}, "previousApiKey", "32 characters"),
    ("route the gateway does not know", {"apiRoutes": ["/v1/models", "/metrics"]}, "apiRoutes", '"/metrics"'),
    (
        "routes without the stack's own probe",
        {"apiRoutes": ["/v1/chat/completions"]},
        "apiRoutes",
        "/v1/completions",
    ),
    ("a route twice", {"apiRoutes": ["/v1/completions", "/v1/completions"]}, "apiRoutes", "more than once"),
    (
        "pooling routes on a generation model",
        {"apiRoutes": ["/v1/completions", "/v1/embeddings"]},
        "apiRoutes",
        "does not serve",
    ),
    (
        "an embedding model's routes without its probe's",
        {"vllmExtraArgs": ["--convert", "embed"], "apiRoutes": ["/v1/models", "/v1/score"]},
        "apiRoutes",
        "leaves out /v1/embeddings",
    ),
    (
        "a classifier's routes without its probe's",
        {"vllmExtraArgs": ["--convert", "classify"], "apiRoutes": ["/v1/score", "/v1/rerank"]},
        "apiRoutes",
        "leaves out /classify",
    ),
    # vllm serve refuses these: the stack says so before anything exists (components/api_routes.py).
    (
        "the --task vllm serve does not have",
        {"vllmExtraArgs": ["--task", "embed"]},
        "vllmExtraArgs",
        "--pooler-config.task",
    ),
    ("--task=", {"vllmExtraArgs": ["--task=classify"]}, "vllmExtraArgs", "unrecognized arguments"),
    ("a --convert vLLM does not take", {"vllmExtraArgs": ["--convert", "reward"]}, "vllmExtraArgs", "'reward'"),
    (
        "a pooling model without its task",
        {"vllmExtraArgs": ["--runner", "pooling"]},
        "vllmExtraArgs",
        '["--runner", "pooling", "--pooler-config.task", "embed"]',
    ),
    (
        "a pooling task without --runner pooling",
        {"vllmExtraArgs": ["--pooler-config.task", "embed"]},
        "vllmExtraArgs",
        "do not say both",
    ),
    (
        "a reward model, served only at /pooling",
        {"vllmExtraArgs": ["--runner", "pooling", "--pooler-config.task", "token_classify"]},
        "vllmExtraArgs",
        "only at /pooling",
    ),
    (
        "a pooling task vLLM removed",
        {"vllmExtraArgs": ["--runner", "pooling", "--pooler-config.task=score"]},
        "vllmExtraArgs",
        "not a pooling task vLLM takes",
    ),
    ("vLLM below its security floor", {"vllmVersion": "0.21.3"}, "vllmVersion", "security floor 0.22.0"),
    ("Ray below its security floor", {"rayVersion": "2.53.9"}, "rayVersion", "security floor 2.54.0"),
    ("version that is not a release", {"rayVersion": "2.60.0rc1"}, "rayVersion", "MAJOR.MINOR.PATCH"),
    ("GPU memory fraction above 1", {"gpuMemoryUtilization": "1.5"}, "gpuMemoryUtilization", "at most 1"),
    ("GPU memory fraction not a number", {"gpuMemoryUtilization": "most"}, "gpuMemoryUtilization", "number"),
    ("negative context length", {"maxModelLen": -5}, "maxModelLen", "positive"),
    ("zone of another region", {"availabilityZone": "eu-west-1a"}, "availabilityZone", "us-east-1"),
    ("zone that is not a zone", {"availabilityZone": "east"}, "availabilityZone", "us-east-1a"),
    ("public VPC range", {"vpcCidr": "8.8.0.0/16"}, "vpcCidr", "private"),
    ("VPC too large", {"vpcCidr": "10.0.0.0/8"}, "vpcCidr", "/16 to /24"),
    ("half an existing network", {"vpcId": "vpc-0123456789abcdef0"}, "privateSubnetId", "all or none"),
    (
        "malformed subnet id",
        {"vpcId": "vpc-0123456789abcdef0", "publicSubnetId": "public", "privateSubnetId": "subnet-0123456789abcdef0"},
        "publicSubnetId",
        "subnet-",
    ),
    ("malformed AMI id", {"amiId": "ubuntu"}, "amiId", "ami-"),
    ("malformed capacity reservation", {"capacityReservationId": "reservation-1"}, "capacityReservationId", "cr-"),
    ("capacity block without a reservation", {"capacityBlock": True}, "capacityBlock", "capacityReservationId"),
    (
        "reservation without its zone",
        {"capacityReservationId": "cr-0123456789abcdef0"},
        "capacityReservationId",
        "availabilityZone",
    ),
    ("no read timeout", {"apiReadTimeoutSeconds": 0}, "apiReadTimeoutSeconds", "from 1 to 3600"),
    ("read timeout over an hour", {"apiReadTimeoutSeconds": 7200}, "apiReadTimeoutSeconds", "stream"),
    ("read timeout in words", {"apiReadTimeoutSeconds": "ten minutes"}, "apiReadTimeoutSeconds", "whole number"),
    ("negative rate limit", {"apiRateLimitPerSecond": -1}, "apiRateLimitPerSecond", "0 turns the limit off"),
    ("rate limit beyond reason", {"apiRateLimitPerSecond": 100000}, "apiRateLimitPerSecond", "10000"),
    ("negative in-flight limit", {"apiMaxRequestsInFlightPerKey": -1}, "apiMaxRequestsInFlightPerKey", "0 turns"),
    (
        "in-flight limit beyond reason",
        {"apiMaxRequestsInFlightPerAddress": 10**6},
        "apiMaxRequestsInFlightPerAddress",
        "100000",
    ),
    ("in-flight limit in words", {"apiMaxRequestsInFlightPerKey": "many"}, "apiMaxRequestsInFlightPerKey", "whole"),
    ("placement group with a semicolon", {"placementGroupName": "pg;reboot"}, "placementGroupName", "';'"),
    ("placement group with a space", {"placementGroupName": "my group"}, "placementGroupName", "' '"),
    ("placement group name too long", {"placementGroupName": "p" * 256}, "placementGroupName", "255"),
    ("placement group name not ASCII", {"placementGroupName": "gruppe-\u00fc"}, "placementGroupName", "ASCII"),
    ("root volume too small", {"rootVolumeGiB": 20}, "rootVolumeGiB", "150"),
    ("misspelt key", {"instancetype": "p4d.24xlarge"}, "instancetype", "did you mean instanceType"),
    ("gateway type that is not a type", {"gatewayInstanceType": "small"}, "gatewayInstanceType", "t3.small"),
    ("hub that is not a URL", {"hfEndpoint": "hf-mirror;curl evil"}, "hfEndpoint", "http(s) URL"),
    ("revision with shell characters", {"modelRevision": "main;reboot"}, "modelRevision", "inject"),
    ("revision climbing out of the cache", {"modelRevision": "a/../../etc"}, "modelRevision", "branch, tag or commit"),
    (
        "certificate without its key",
        {"tlsCertificate": CERT, "endpointHostname": "llm.example.com"},
        "tlsPrivateKey",
        "--secret",
    ),
    ("certificate without a hostname", {"tlsCertificate": CERT, "tlsPrivateKey": KEY}, "endpointHostname", "DNS name"),
    (
        "key that is not PEM",
        {"tlsCertificate": CERT, "tlsPrivateKey": "secret", "endpointHostname": "llm.example.com"},
        "tlsPrivateKey",
        "PEM",
    ),
    ("hostname without a certificate", {"endpointHostname": "llm.example.com"}, "tlsCertificate", "PEM certificate"),
]


@pytest.mark.parametrize("what, changes, key, phrase", BAD_CONFIGS, ids=[case[0] for case in BAD_CONFIGS])
def test_bad_config_is_refused_naming_the_key(what, changes, key, phrase):
    error = problems_of(**changes)
    named = [p for p in error.problems if p.key == key]
    assert named, f"{what}: no problem names {key}: {error}"
    assert any(phrase in str(p) for p in named), f"{what}: {phrase!r} not in {[str(p) for p in named]}"
    assert f"vllm-cluster:{key}" in str(error)


def test_every_problem_is_reported_at_once():
    error = problems_of(nodes=0, model="a;b", adminCidrs=["0.0.0.0/0"])
    assert {"nodes", "model", "adminCidrs"} <= set(error.keys)


def test_secret_values_never_appear_in_errors():
    token = "hf_" + "x" * 10 + "'quote"
    key = "k" * 12
    error = problems_of(hfToken=token, apiKey=key)
    assert token not in str(error) and key not in str(error)
    assert "<hidden, 12 characters>" in str(error)


@pytest.mark.parametrize("misspelt", ["hftoken", "apikey", "HfToken"])
def test_a_misspelt_secret_key_does_not_leak_its_value(misspelt):
    value = "hf_" + "s" * 30
    error = problems_of(**{misspelt: value})
    assert misspelt in error.keys and value not in str(error)


def test_secret_values_are_hidden_in_the_spec_repr():
    spec = spec_of(apiKey="a" * 40, hfToken="hf_abcdef")
    assert "aaaa" not in repr(spec) and "hf_abcdef" not in repr(spec)
    assert spec.api_key.reveal() == "a" * 40


def test_the_routes_follow_the_models_task_unless_api_routes_names_them():
    from components import api_routes

    assert spec_of().api_routes == api_routes.DEFAULT_GENERATION_ROUTES
    assert "/v1/responses" in spec_of().api_routes and "/tokenize" not in spec_of().api_routes
    embed = ("/v1/models", "/v1/embeddings", "/v1/score", "/v1/rerank", "/health")
    for pooling in (
        ["--runner", "pooling", "--pooler-config.task", "embed"],
        ["--runner=pooling", "--pooler-config.task=embed"],
        ["--convert", "embed"],
        ["--runner", "pooling", "--pooler-config.task", "token_embed"],
    ):
        assert spec_of(vllmExtraArgs=pooling).api_routes == embed, pooling
    # A classifier's own route is /classify; a cross-encoder (one label) also scores and reranks.
    classify = ("/v1/models", "/classify", "/v1/score", "/v1/rerank", "/health")
    for pooling in (["--convert", "classify"], ["--runner", "pooling", "--pooler-config.task", "classify"]):
        assert spec_of(vllmExtraArgs=pooling).api_routes == classify, pooling
    assert spec_of(vllmExtraArgs=["--runner", "generate"]).api_routes == api_routes.DEFAULT_GENERATION_ROUTES
    chosen = ["/v1/completions", "/v1/models", "/tokenize", "/detokenize"]
    assert spec_of(apiRoutes=chosen).api_routes == tuple(chosen)
    assert spec_of(apiRoutes=json.dumps(chosen)).api_routes == tuple(chosen)


def test_the_vllm_facts_of_the_routes_and_probes_were_read_in_the_pinned_release():
    """components/api_routes.py's facts (flags, routes, request schemas by task) were read
    in the wheels of vLLM 0.33.0 and 0.22.0. A new pin or floor needs them read again in
    its source (vllm/entrypoints/pooling/factories.py, vllm/config/model.py, the
    protocols): then update the versions here."""
    assert (versions.VLLM_VERSION, versions.VLLM_MIN_VERSION) == ("0.33.0", "0.22.0")


@pytest.mark.parametrize(
    "extra_args, route, body",
    [
        ([], "/v1/completions", {"model": "served", "prompt": "Hello", "max_tokens": 1}),
        (["--convert", "embed"], "/v1/embeddings", {"model": "served", "input": "Hello"}),
        (["--runner", "pooling", "--pooler-config.task=classify"], "/classify", {"model": "served", "input": "Hello"}),
        (
            ["--runner", "pooling", "--pooler-config.task", "token_embed"],
            "/v1/score",
            {"model": "served", "text_1": "Hello", "text_2": "Hello"},
        ),
    ],
)
def test_the_stacks_probe_is_a_request_of_the_models_task_on_a_route_the_gateway_forwards(extra_args, route, body):
    """vLLM serves no completion for a pooling model: the stack's probe follows the task,
    and its route is one the gateway forwards (the spec refuses apiRoutes without it)."""
    from components import api_routes

    spec = spec_of(vllmExtraArgs=extra_args, servedModelName="served")
    probe = api_routes.stack_probe(spec.vllm_extra_args, spec.served_model_name)
    assert (probe.route, json.loads(probe.body_json())) == (route, body)
    assert probe.route in spec.api_routes
    assert problems_of(vllmExtraArgs=extra_args, apiRoutes=["/v1/models", "/health"]).keys == ["apiRoutes"]


def test_a_previous_key_beside_the_new_one_is_kept_secret():
    spec = load_spec(
        {**GOOD, "apiKey": "n" * 40, "previousApiKey": "o" * 40}, stack="t", secret_keys={"apiKey", "previousApiKey"}
    )
    assert spec.previous_api_key.reveal() == "o" * 40 and "oooo" not in repr(spec)
    with pytest.raises(SpecError) as caught:
        load_spec({**GOOD, "apiKey": "n" * 40, "previousApiKey": "o" * 40}, stack="t", secret_keys={"apiKey"})
    assert caught.value.keys == ["previousApiKey"] and "--secret" in str(caught.value)
    assert "oooo" not in str(caught.value)


def test_secrets_set_in_plain_text_are_refused():
    with pytest.raises(SpecError) as caught:
        load_spec({**GOOD, "hfToken": "hf_abcdef"}, stack="t", secret_keys=set())
    assert caught.value.keys == ["hfToken"] and "--secret" in str(caught.value)
    spec = load_spec({**GOOD, "hfToken": "hf_abcdef"}, stack="t", secret_keys={"hfToken"})
    assert spec.hf_token.reveal() == "hf_abcdef"


def test_a_user_certificate_needs_its_key_set_as_a_secret_and_never_shows_it():
    trio = {**GOOD, "tlsCertificate": CERT, "tlsPrivateKey": KEY, "endpointHostname": "llm.example.com"}
    with pytest.raises(SpecError) as caught:
        load_spec(trio, stack="t", secret_keys=set())
    assert caught.value.keys == ["tlsPrivateKey"] and "TUlJS2V5" not in str(caught.value)
    spec = load_spec(trio, stack="t", secret_keys={"tlsPrivateKey"})
    assert spec.tls.hostname == "llm.example.com" and spec.tls.private_key.reveal() == KEY
    assert "TUlJS2V5" not in repr(spec)


def test_model_revision_defaults_to_main():
    assert spec_of().model_revision == "main"
    assert spec_of(modelRevision="0123456789abcdef0123456789abcdef01234567").model_revision.startswith("0123")


def test_public_api_is_allowed_only_when_asked_for():
    spec = spec_of(apiAllowedCidrs=["0.0.0.0/0", "::/0"], allowPublicApi=True)
    assert spec.api_allowed_cidrs == ("0.0.0.0/0", "::/0")


def test_existing_network_is_taken_whole():
    spec = spec_of(
        vpcId="vpc-0123456789abcdef0",
        publicSubnetId="subnet-0123456789abcdef0",
        privateSubnetId="subnet-0fedcba9876543210",
    )
    assert spec.existing_network.private_subnet_id == "subnet-0fedcba9876543210"


def test_every_key_is_understood_by_the_loader():
    """A key declared in CONFIG_KEYS but never read would be silently ignored."""
    import importlib
    import inspect
    import pkgutil

    from components import spec as spec_package

    # The checkers live in the package's domain modules: check_* reads a domain's keys,
    # _check_* one step of it.
    modules = [
        importlib.import_module(f"components.spec.{m.name}") for m in pkgutil.iter_modules(spec_package.__path__)
    ]
    checkers = [
        f
        for module in modules
        for name, f in vars(module).items()
        if name.lstrip("_").startswith("check") and inspect.isfunction(f) and f.__module__ == module.__name__
    ]
    source = "".join(inspect.getsource(f) for f in checkers)
    for key in CONFIG_KEYS:
        assert f'"{key.name}"' in source, f"no checker reads {key.name}"


RESERVATION = "cr-0123456789abcdef0"


@pytest.mark.parametrize(
    "block, page", [(False, "capacity-reservations-launch.html"), (True, "capacity-blocks-launch.html")]
)
def test_a_reservation_without_its_zone_names_both_keys_the_value_the_fix_and_the_rule(block, page):
    """Without availabilityZone the nodes go to the first zone that offers the type; a
    Capacity Reservation or Capacity Block serves only its own zone."""
    error = problems_of(capacityReservationId=RESERVATION, capacityBlock=block)
    [problem] = [p for p in error.problems if p.key == "capacityReservationId"]
    text = str(problem)
    assert RESERVATION in text and "availabilityZone" in text
    assert "pulumi config set vllm-cluster:availabilityZone" in text
    assert f"https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/{page}" in text


def test_a_reservation_in_its_zone_or_in_an_existing_subnet_is_accepted():
    reserved = spec_of(capacityReservationId=RESERVATION, availabilityZone="us-east-1b")
    assert reserved.capacity_reservation_id == RESERVATION
    # With an existing network the nodes go where privateSubnetId is; availabilityZone does not apply.
    existing = spec_of(
        capacityReservationId=RESERVATION,
        vpcId="vpc-0123456789abcdef0",
        publicSubnetId="subnet-0123456789abcdef0",
        privateSubnetId="subnet-0fedcba9876543210",
    )
    assert existing.capacity_reservation_id == RESERVATION


def test_an_existing_placement_group_is_taken_by_name():
    assert spec_of().placement_group_name is None
    assert spec_of(placementGroupName="").placement_group_name is None
    assert spec_of(placementGroupName="reserved-pg_1.a").placement_group_name == "reserved-pg_1.a"
    assert spec_of(placementGroupName="p" * 255).placement_group_name == "p" * 255


def test_the_gateway_limits_default_to_ten_minutes_and_no_limit_on_a_client():
    """Issue 48: 20 requests a second refused 212 of 256 at 64 in flight from one client;
    by default one client may use the whole stack."""
    spec = spec_of()
    assert (spec.api_read_timeout_seconds, spec.api_rate_limit_per_second) == (600, 0)
    assert (spec.api_max_requests_in_flight_per_key, spec.api_max_requests_in_flight_per_address) == (0, 0)
    spec = spec_of(
        apiReadTimeoutSeconds="1800",
        apiRateLimitPerSecond=20,
        apiMaxRequestsInFlightPerKey="64",
        apiMaxRequestsInFlightPerAddress=8,
    )
    assert (spec.api_read_timeout_seconds, spec.api_rate_limit_per_second) == (1800, 20)
    assert (spec.api_max_requests_in_flight_per_key, spec.api_max_requests_in_flight_per_address) == (64, 8)


VPC = "vpc-0123456789abcdef0"
EFS_DNS_DOC = "https://docs.aws.amazon.com/efs/latest/ug/mounting-fs-mount-cmd-dns-name.html"


def test_an_existing_vpc_without_dns_hostnames_is_refused_with_the_fix():
    """The nodes mount EFS by its DNS name, which never resolves in such a VPC: setup
    would wait ten minutes and fail."""
    [problem] = existing_vpc_problems(VPC, dns_support=True, dns_hostnames=False)
    text = str(problem)
    assert problem.key == "vpcId" and VPC in text and "enableDnsHostnames" in text
    assert f"aws ec2 modify-vpc-attribute --vpc-id {VPC} --enable-dns-hostnames" in text
    assert EFS_DNS_DOC in text


def test_an_existing_vpc_without_dns_support_names_both_fixes_support_first():
    problems = existing_vpc_problems(VPC, dns_support=False, dns_hostnames=False)
    assert [p.key for p in problems] == ["vpcId", "vpcId"]
    assert "enableDnsSupport" in str(problems[0]) and "--enable-dns-support" in str(problems[0])
    assert "enableDnsHostnames" in str(problems[1])
    assert existing_vpc_problems(VPC, dns_support=True, dns_hostnames=True) == []


# --- dtype in vllmExtraArgs ------------------------------------------------------------


@pytest.mark.parametrize(
    "args, passed",
    [
        (["--dtype", "bf16"], ("--dtype", "bfloat16")),
        (["--dtype=fp16"], ("--dtype=float16",)),
        (["--dtype", "FP32", "--enforce-eager"], ("--dtype", "float32", "--enforce-eager")),
        (["--dtype", "half"], ("--dtype", "half")),  # vLLM's own spelling is passed as written
        (["--dtype=auto"], ("--dtype=auto",)),
    ],
)
def test_a_dtype_in_any_spelling_reaches_vllm_in_one_it_accepts(args, passed):
    from components import bootstrap

    spec = spec_of(vllmExtraArgs=args)
    assert spec.vllm_extra_args == passed
    assert bootstrap.vllm_serve_args(spec, "10.0.0.1")[-len(passed) :] == list(passed)


def test_an_unknown_dtype_names_the_key_the_flag_the_value_and_every_spelling():
    [problem] = problems_of(vllmExtraArgs=["--dtype", "bf17"]).problems
    text = str(problem)
    assert problem.key == "vllmExtraArgs" and "--dtype" in text and "bf17" in text
    for spelling in ("auto", "half", "float16", "bfloat16", "float", "float32", "bf16", "fp16", "fp32"):
        assert spelling in text, spelling


@pytest.mark.parametrize("quantized", ["fp8", "int4", "--dtype=int8"])
def test_a_quantized_weight_type_is_not_a_vllm_dtype(quantized):
    args = [quantized] if quantized.startswith("--") else ["--dtype", quantized]
    [problem] = problems_of(vllmExtraArgs=args).problems
    assert problem.key == "vllmExtraArgs" and "--quantization" in str(problem)


def test_a_dtype_flag_without_its_value_is_refused():
    [problem] = problems_of(vllmExtraArgs=["--enforce-eager", "--dtype"]).problems
    assert problem.key == "vllmExtraArgs" and "--dtype" in str(problem)


# --- values of the wrong type --------------------------------------------------------------

YAML_DATE = datetime.date(2024, 1, 1)  # what YAML makes of `2024-01-01`
WRONG_BY_TYPE = {
    "string": [[1], {"name": "x"}, YAML_DATE, b"bytes"],
    "integer": ["two", [1], 2.5, True, {"n": 1}, YAML_DATE, "9" * 5000],
    "boolean": ["maybe", [True], 1, YAML_DATE],
    "array": [5, {"cidr": "203.0.113.0/24"}, "not a list", [1], [["nested"]], "[" * 100000],
}
# Keys declared as strings in Pulumi.yaml that hold another kind of value.
WRONG_BY_KEY = {
    "efa": ["maybe", [True], 5],
    "gpuMemoryUtilization": ["most", [0.9], True, 10**400],
}


def wrong_values():
    for key in CONFIG_KEYS:
        for value in WRONG_BY_KEY.get(key.name, WRONG_BY_TYPE[key.type]):
            yield pytest.param(key.name, value, id=f"{key.name}={str(value)[:20]!s}")


@pytest.mark.parametrize("key, value", list(wrong_values()))
def test_a_value_of_the_wrong_type_is_one_problem_naming_the_key_the_type_and_the_fix(key, value):
    try:
        load_spec({**GOOD, key: value}, stack="test", region="us-east-1", secret_keys={key})
    except SpecError as error:
        problems = error.problems
    else:
        raise AssertionError(f"{key} = {value!r} was accepted")
    assert [p.key for p in problems] == [key], [str(p) for p in problems]
    text = str(problems[0])
    assert f"vllm-cluster:{key} = " in text and "Fix:" in text
    assert any(kind in text for kind in ("text", "whole number", "true or false", "list", "number")), text


@pytest.mark.parametrize(
    "key, value, kind",
    [
        ("nodes", "two", "whole number"),
        ("tensorParallelSize", [1], "whole number"),
        ("allowPublicApi", "maybe", "true or false"),
        ("model", ["org/model"], "text"),
        ("adminCidrs", 5, "list"),
    ],
)
def test_the_wrong_type_message_shows_the_value(key, value, kind):
    [problem] = problems_of(**{key: value}).problems
    assert problem.value == json.dumps(value) if not isinstance(value, str) else problem.value == f'"{value}"'
    assert kind in problem.message


# --- the zone and the region ----------------------------------------------------------


def test_the_planner_refuses_a_zone_outside_the_stacks_region(tmp_path):
    """The planner reads the stack file, aws:region included, and refuses what `pulumi up` would."""
    from cli.stack_file import StackFileError, read_stack

    stack_file = tmp_path / "Pulumi.zones.yaml"
    stack_file.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "aws:region": "us-east-1",
                    **{f"vllm-cluster:{k}": v for k, v in GOOD.items()},
                    "vllm-cluster:availabilityZone": "eu-west-1a",
                }
            }
        )
    )
    with pytest.raises(StackFileError) as caught:
        read_stack("zones", str(stack_file))
    [problem] = caught.value.__cause__.problems  # the spec's error, which the CLI prints on one line
    assert problem.key == "availabilityZone" and "eu-west-1a" in str(problem) and "aws:region" in str(problem)


def test_the_program_declares_nothing_for_a_zone_outside_aws_region():
    from pulumi_mocks import run_stack

    run = run_stack("dev", {"availabilityZone": "eu-west-1a"})
    assert run.resources == []
    assert "vllm-cluster:availabilityZone" in str(run.error) and "aws:region" in str(run.error)


def test_a_zone_inside_the_region_is_accepted():
    assert spec_of(availabilityZone="us-east-1f").availability_zone == "us-east-1f"
    assert load_spec({**GOOD, "availabilityZone": "us-gov-west-1a"}, stack="t", region="us-gov-west-1")


# --- AWS rules link the page that states them -----------------------------------------------
# Errors about the program's own rules (the root volume's floor, shell characters) need none.

AWS_RULES = [
    ("EFA on a type without it", {"instanceType": "g6.xlarge", "nodes": 1, "efa": "true"}, "efa"),
    ("zone of another region", {"availabilityZone": "eu-west-1a"}, "availabilityZone"),
    ("zone that is not a zone", {"availabilityZone": "east"}, "availabilityZone"),
    ("reservation without its zone", {"capacityReservationId": RESERVATION}, "capacityReservationId"),
    ("block without its zone", {"capacityReservationId": RESERVATION, "capacityBlock": True}, "capacityReservationId"),
    ("capacity block without a reservation", {"capacityBlock": True}, "capacityBlock"),
    ("malformed capacity reservation", {"capacityReservationId": "reservation-1"}, "capacityReservationId"),
    ("placement group name too long", {"placementGroupName": "p" * 256}, "placementGroupName"),
    ("placement group name not ASCII", {"placementGroupName": "gruppe-\u00fc"}, "placementGroupName"),
    ("VPC larger than a /16", {"vpcCidr": "10.0.0.0/8"}, "vpcCidr"),
    ("gateway type that is not a type", {"gatewayInstanceType": "small"}, "gatewayInstanceType"),
]


@pytest.mark.parametrize("what, changes, key", AWS_RULES, ids=[case[0] for case in AWS_RULES])
def test_an_error_about_an_aws_rule_links_the_aws_page_that_states_it(what, changes, key):
    named = [str(p) for p in problems_of(**changes).problems if p.key == key]
    assert named and all(re.search(r"https://docs\.aws\.amazon\.com/\S+", text) for text in named), named


# --- the nodes' lock (nodeLock) ----------------------------------------------------------


def test_the_pinned_versions_deploy_the_checked_in_gpu_lock():
    assert spec_of().node_lock == "locks/node-gpu-py{}{}-x86_64.txt".format(*image.PYTHON_VERSION)


def test_other_versions_without_a_lock_of_them_are_refused_with_the_command_that_makes_one():
    error = problems_of(vllmVersion="0.34.0")
    (problem,) = [p for p in error.problems if p.key == "nodeLock"]
    assert "vLLM 0.34.0" not in str(problem)  # says the stack's version as the stack wrote it
    assert "vllmVersion 0.34.0" in str(problem) and f"holds vLLM {versions.VLLM_VERSION}" in str(problem)
    assert "python tools/lock_node_env.py --vllm 0.34.0 --ray " in str(problem) and "it writes locks/" in str(problem)
    assert "pulumi config set vllm-cluster:nodeLock" in str(problem)


def _lock_with(tmp_path, edit) -> str:
    path = tmp_path / "lock.txt"
    path.write_text(edit(node_env.default_lock_path().read_text()))
    return str(path)


LOCK_PROBLEMS = [
    ("a lock of another vLLM", lambda t: re.sub(r"(?m)^vllm==\S+", "vllm==0.30.0", t), "holds vllm==0.30.0"),
    ("a lock without uv", lambda t: re.sub(r"(?m)^uv==\S+ \\\n(\s+--hash=\S+( \\)?\n)+", "", t), "no uv"),
    ("a lock with a package unhashed", lambda t: t + "six==1.17.0\n", "six==1.17.0 has no sha256 hash"),
    ("a loose requirement", lambda t: t + "numpy>=2\n", "'numpy>=2' is not an exact pin"),
    ("no package at all", lambda t: "# nothing\n", "holds no package"),
]


@pytest.mark.parametrize("what, edit, phrase", LOCK_PROBLEMS, ids=[case[0] for case in LOCK_PROBLEMS])
def test_a_lock_the_nodes_cannot_install_is_refused_before_any_resource(tmp_path, what, edit, phrase):
    error = problems_of(nodeLock=_lock_with(tmp_path, edit))
    (problem,) = [p for p in error.problems if p.key == "nodeLock"]
    assert phrase in str(problem), what
    assert "tools/lock_node_env.py" in str(problem)


def test_a_lock_that_is_not_there_is_refused():
    error = problems_of(nodeLock="locks/no-such-lock.txt")
    (problem,) = [p for p in error.problems if p.key == "nodeLock"]
    assert "cannot be read" in str(problem) and "no-such-lock.txt" in str(problem)


def test_a_lock_of_the_stacks_versions_is_taken(tmp_path):
    lock = _lock_with(tmp_path, lambda t: re.sub(r"(?m)^vllm==\S+", "vllm==0.34.0", t))
    spec = spec_of(vllmVersion="0.34.0", nodeLock=lock)
    assert spec.node_lock == lock


# --- idleStopMinutes (issue 23) -------------------------------------------------------------


def test_idle_stop_is_off_unless_set_and_takes_whole_minutes():
    assert spec_of().idle_stop_minutes is None
    assert spec_of(idleStopMinutes=0).idle_stop_minutes is None  # Pulumi.yaml's default: never
    assert spec_of(idleStopMinutes="30").idle_stop_minutes == 30
    assert spec_of(idleStopMinutes=10080).idle_stop_minutes == 10080


@pytest.mark.parametrize("value", [-1, 10081, "soon", 1.5])
def test_idle_stop_outside_a_minute_to_a_week_is_refused_with_the_fix(value):
    error = problems_of(idleStopMinutes=value)
    assert error.keys == ["idleStopMinutes"]
    assert "pulumi config set vllm-cluster:idleStopMinutes" in str(error) or "whole number" in str(error)


@pytest.mark.parametrize(
    "reservation, key",
    [
        ({"capacityReservationId": "cr-0123456789abcdef0"}, "capacityReservationId"),
        ({"capacityReservationId": "cr-0123456789abcdef0", "capacityBlock": True}, "capacityReservationId"),
    ],
)
def test_idle_stop_with_reserved_capacity_is_refused_naming_both_keys_and_the_fix(reservation, key):
    """Reserved capacity is paid whether its instances run or not: stopping them saves nothing."""
    error = problems_of(idleStopMinutes=30, availabilityZone="us-east-1a", **reservation)
    assert error.keys == ["idleStopMinutes"]
    message = str(error)
    assert f"vllm-cluster:{key}" in message and "vllm-cluster:idleStopMinutes = 30" in message
    assert "paid for whether" in message and "pulumi config rm vllm-cluster:idleStopMinutes" in message


def test_idle_stop_with_a_capacity_block_alone_names_the_block_key():
    error = problems_of(idleStopMinutes=30, capacityBlock=True)
    problem = next(p for p in error.problems if p.key == "idleStopMinutes")
    assert "vllm-cluster:capacityBlock" in problem.message


def test_the_wake_give_up_bound_is_derived_unless_set_and_takes_whole_minutes():
    assert spec_of(idleStopMinutes=30).wake_give_up_minutes is None
    assert spec_of(idleStopMinutes=30, wakeGiveUpMinutes=0).wake_give_up_minutes is None  # the default: derived
    assert spec_of(idleStopMinutes=30, wakeGiveUpMinutes="45").wake_give_up_minutes == 45


@pytest.mark.parametrize("value", [4, 1441, "soon"])
def test_a_wake_give_up_bound_outside_5_minutes_to_a_day_is_refused_with_the_fix(value):
    """Under 5 minutes no stack's wake can finish, nor the waker's retries (30 s doubling) get
    a few tries in; over a day a GPU node started for nothing runs that long unseen."""
    error = problems_of(idleStopMinutes=30, wakeGiveUpMinutes=value)
    assert error.keys == ["wakeGiveUpMinutes"]
    assert "pulumi config set vllm-cluster:wakeGiveUpMinutes" in str(error) or "whole number" in str(error)


def test_a_wake_give_up_bound_without_idle_stop_is_refused_naming_both_keys():
    """Without idleStopMinutes nothing stops, so nothing wakes: the key would be ignored."""
    error = problems_of(wakeGiveUpMinutes=30)
    assert error.keys == ["wakeGiveUpMinutes"]
    message = str(error)
    assert "vllm-cluster:idleStopMinutes" in message and "pulumi config rm vllm-cluster:wakeGiveUpMinutes" in message


def test_a_wake_give_up_bound_shorter_than_the_stacks_wake_is_warned_with_the_fix():
    """The user may know their wake better than the estimate; a bound under it gives up
    every wake the estimate is right about, so it is said at deploy, not refused."""
    spec = spec_of(idleStopMinutes=30)
    wake = idle_stop.expected_wake_seconds(
        spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size, spec.on_stage_volume
    )
    short = max(5, wake // 60 - 1)
    assert short * 60 < wake, "the test stack's wake must be longer than 6 minutes"
    warned = [w for w in spec_of(idleStopMinutes=30, wakeGiveUpMinutes=short).warnings if "wakeGiveUpMinutes" in w]
    assert len(warned) == 1 and f"wakeGiveUpMinutes is {short} min" in warned[0], warned
    assert "pulumi config set vllm-cluster:wakeGiveUpMinutes" in warned[0], warned
    enough = spec_of(idleStopMinutes=30, wakeGiveUpMinutes=-(-wake // 60))
    assert not [w for w in enough.warnings if "wakeGiveUpMinutes" in w], enough.warnings


def test_idle_stop_with_your_own_hosts_is_refused_naming_both_keys():
    """Nothing can start a machine of the user's own once it powered itself off."""
    own = yaml.safe_load(open("stacks/Pulumi.own-hosts.yaml"))["config"]
    config = {k.split(":", 1)[1]: v for k, v in own.items() if k.startswith("vllm-cluster:")}
    config["sshPrivateKey"] = "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----\n"
    assert load_spec(config, stack="own-hosts").idle_stop_minutes is None
    with pytest.raises(SpecError) as caught:
        load_spec({**config, "idleStopMinutes": 30}, stack="own-hosts")
    assert caught.value.keys == ["idleStopMinutes"]
    assert "vllm-cluster:hosts" in str(caught.value) and "nothing in the stack can start it again" in str(caught.value)


def test_the_fabric_floor_is_the_instance_types_unless_set_in_gb_per_second():
    assert spec_of().fabric_floor_gbps is None
    assert spec_of(fabricFloorGBps="12.5").fabric_floor_gbps == 12.5
    assert spec_of(fabricFloorGBps=40).fabric_floor_gbps == 40.0


@pytest.mark.parametrize("value", ["0", -3, "3200", "fast", "nan"])
def test_a_fabric_floor_that_is_no_bus_bandwidth_is_refused_naming_key_value_and_fix(value):
    """Above 0 (a floor of 0 would gate nothing) and at most 1000 GB/s: p5's 3200 Gbps is
    400 GB/s, so 3200 is Gbps written for GB/s."""
    error = problems_of(fabricFloorGBps=value)
    assert error.keys == ["fabricFloorGBps"]
    assert str(value) in str(error)
    assert "pulumi config set vllm-cluster:fabricFloorGBps" in str(error)


# --- maxReplicas and replicas 0 (issue 36, point 1) -------------------------------------------


def test_max_replicas_defaults_to_replicas():
    assert spec_of().max_replicas == 1
    assert spec_of(replicas=2).max_replicas == 2
    assert spec_of(replicas=2, maxReplicas=0).max_replicas == 2  # Pulumi.yaml's default: replicas
    assert spec_of(replicas=2, maxReplicas="2").max_replicas == 2


@pytest.mark.parametrize("value", [-1, 17])
def test_max_replicas_outside_1_to_16_is_refused_with_the_fix(value):
    error = problems_of(maxReplicas=value, idleStopMinutes=30)
    assert error.keys == ["maxReplicas"]
    assert f"vllm-cluster:maxReplicas = {value}" in str(error) and "must be from 1 to 16" in str(error)
    assert "pulumi config rm vllm-cluster:maxReplicas" in str(error)


def test_max_replicas_below_replicas_is_refused_naming_both():
    error = problems_of(replicas=3, maxReplicas=2, idleStopMinutes=30)
    assert error.keys == ["maxReplicas"]
    assert "below replicas (3)" in str(error) and "pulumi config set vllm-cluster:maxReplicas 3 or more" in str(error)


def test_replicas_below_0_is_refused_with_the_range():
    error = problems_of(replicas=-1)
    assert error.keys == ["replicas"] and "between 0 and 16" in str(error)


def test_replicas_0_without_max_replicas_is_refused_as_a_stack_of_no_gang():
    error = problems_of(replicas=0, idleStopMinutes=30)
    assert error.keys == ["replicas"]
    assert "vllm-cluster:replicas = 0" in str(error) and "pulumi config set vllm-cluster:maxReplicas 1" in str(error)


@pytest.mark.parametrize(
    ("changes", "key"),
    [({"replicas": 1, "maxReplicas": 2}, "maxReplicas"), ({"replicas": 0, "maxReplicas": 1}, "replicas")],
)
def test_warm_gangs_without_idle_stop_are_refused_naming_the_fix(changes, key):
    """A warm gang sleeps again by the idle rule; without it one woken would run for ever,
    and replicas 0 would never sleep at all."""
    error = problems_of(**changes)
    assert error.keys == [key]
    assert "without vllm-cluster:idleStopMinutes" in str(error)
    assert "pulumi config set vllm-cluster:idleStopMinutes 30" in str(error)


@pytest.mark.parametrize("reservation", [{"capacityReservationId": "cr-0123456789abcdef0"}, {"capacityBlock": True}])
def test_warm_gangs_with_reserved_capacity_are_refused_naming_both_keys(reservation):
    """Reserved capacity is paid whether its instances run or not: a warm gang kept stopped
    saves nothing. (idleStopMinutes is refused with it too, on its own key; a Capacity Block
    without a reservation id is a problem of its own as well.)"""
    error = problems_of(maxReplicas=2, idleStopMinutes=30, availabilityZone="us-east-1a", **reservation)
    assert {"idleStopMinutes", "maxReplicas"} <= set(error.keys)
    problem = next(p for p in error.problems if p.key == "maxReplicas")
    assert f"vllm-cluster:{next(iter(reservation))} set" in problem.message
    assert "paid whether its instances run or not" in problem.message
    assert "pulumi config rm vllm-cluster:maxReplicas" in problem.message


def test_warm_gangs_with_an_existing_placement_group_are_refused():
    error = problems_of(maxReplicas=2, idleStopMinutes=30, placementGroupName="mine")
    assert error.keys == ["maxReplicas"] and "placement group of its own" in str(error)


def test_a_valid_warm_pool_declares_every_gang_the_first_replicas_always_on():
    """maxReplicas gangs are declared (issue 36): the first `replicas` always serve, the
    rest are warm; the stack's nodes (quotas, cost of all on, EBS) count every gang."""
    spec = spec_of(replicas=1, maxReplicas=3, idleStopMinutes=30)
    assert (spec.replicas, spec.max_replicas, spec.declared_gangs) == (1, 3, 3)
    assert spec.has_warm_gangs
    assert [spec.gang_role(gang) for gang in range(3)] == ["always-on", "warm", "warm"]
    assert spec.total_nodes == 3 * spec.nodes and spec.always_on_nodes == spec.nodes


def test_replicas_0_declares_every_gang_warm():
    spec = spec_of(replicas=0, maxReplicas=2, idleStopMinutes=30)
    assert (spec.declared_gangs, spec.always_on_nodes) == (2, 0)
    assert [spec.gang_role(gang) for gang in range(2)] == ["warm", "warm"]


def test_without_max_replicas_every_gang_is_always_on():
    spec = spec_of(replicas=2)
    assert (spec.declared_gangs, spec.has_warm_gangs, spec.total_nodes) == (2, False, 2 * spec.nodes)
    assert [spec.gang_role(gang) for gang in range(2)] == ["always-on", "always-on"]
