"""The planner's arithmetic, with cases a user can check by hand."""

import dataclasses

import pytest

from components import catalog, models, sizing

LLAMA_70B = sizing.ModelSize.of(models.lookup("meta-llama/Llama-3.1-70B-Instruct"), "meta-llama/Llama-3.1-70B-Instruct")
P4D = catalog.CATALOG["p4d.24xlarge"]
# The same type without an instance store: what every node does without the local copy.
NO_NVME_P4D = dataclasses.replace(P4D, instance_store_gb=0, instance_store_disks=0, instance_store_read_iops=0)
MIB = 2**20


def test_a_70b_bf16_model_needs_about_140_gb_of_weights():
    assert LLAMA_70B.weight_bytes / 1e9 == pytest.approx(141.2, abs=0.1)
    assert sizing.ModelSize.of(None, "x", params_b=70, dtype="bf16").weight_bytes == 140e9
    assert sizing.ModelSize.of(None, "x", params_b=70, dtype="int4").weight_bytes == 35e9


def test_a_70b_model_does_not_fit_on_one_g5_12xlarge():
    result = sizing.fit(LLAMA_70B, catalog.CATALOG["g5.12xlarge"], 4, 1, None, 8192)
    assert not result.fits and "no room" in result.reason
    assert result.weights_per_rank_gib == pytest.approx(141.2e9 / 4 / 2**30, rel=1e-3)


def test_a_70b_model_fits_on_two_p4d_with_tp8_pp2():
    result = sizing.fit(LLAMA_70B, catalog.CATALOG["p4d.24xlarge"], 8, 2, 0.92, 16384)
    assert result.fits
    # 0.92 x 40 GiB - 141.2 GB / 16 - 2 GiB runtime
    assert result.kv_room_per_rank_gib == pytest.approx(0.92 * 40 - 141.2e9 / 16 / 2**30 - 2, abs=0.01)


def test_the_prod_figures_by_hand():
    # 70.6e9 x 2 bytes / 16 ranks = 8.825e9 B per GPU; 0.92 x 40 GiB - that - 2 GiB = 28.54e9 B;
    # 2 x 40 layers x 1 head x 128 x 2 bytes = 20480 B a token -> 1,393,614 tokens.
    result = sizing.fit(LLAMA_70B, catalog.CATALOG["p4d.24xlarge"], 8, 2, 0.92, 16384)
    assert result.context_tokens == 1_393_614
    # 180 boot + 60 efs-utils + 4.40 GB / 14.6 MB/s fetch + 4.40 x 93.8 / 1.01 s install
    # + 70.6 GB download per node at 500 MiB/s (134.7 s), beside it 70.6 GB copy to NVMe at
    # 500 MiB/s (134.7 s): the slower, 134.7 s, not both
    # + the fabric check: 30 s + 25 x 256 MiB x 2 x 15/16 at 50 GB/s (400 Gbps) = 30.25 s
    # + 70.6 GB from NVMe at 2,000,000 x 4 KiB/s (8.6 s) + 60 + 2.5 x 70.6 s engine start (236.5 s)
    terms = sizing.time_to_first_token(LLAMA_70B, P4D, 2, 2)
    assert round(sum(t.seconds for t in terms)) == 1360
    assert {t.name: round(t.seconds, 2) for t in terms}["fabric check"] == 30.25
    # One node: no fabric between nodes, no gate, no term.
    assert "fabric check" not in {t.name for t in sizing.time_to_first_token(LLAMA_70B, P4D, 1, 1)}


def test_quantized_weights_keep_a_16_bit_kv_cache_unless_fp8_is_asked_for():
    int4 = sizing.ModelSize.of(models.lookup("meta-llama/Llama-3.1-70B-Instruct"), "m", dtype="int4")
    assert int4.kv_bytes_per_token_per_rank(8, 2) == LLAMA_70B.kv_bytes_per_token_per_rank(8, 2)
    assert dataclasses.replace(int4, kv_cache_dtype="fp8").kv_bytes_per_token_per_rank(8, 2) == 2 * 40 * 128


def test_the_largest_pipeline_stage_decides_the_weights_per_gpu():
    # 80 layers over 3 stages: 27, 27, 26 -> the 27-layer stages hold 27/80 of the weights.
    assert LLAMA_70B.weight_bytes_per_rank(8, 3) == pytest.approx(LLAMA_70B.weight_bytes * 27 / 80 / 8)
    assert sizing.ModelSize.of(None, "x", params_b=8).weight_bytes_per_rank(2, 2) == 8e9 * 2 / 4


def test_a_size_given_by_hand_drops_the_tables_architecture():
    sized = sizing.ModelSize.of(models.lookup("Qwen/Qwen2.5-1.5B-Instruct"), "Qwen/Qwen2.5-1.5B-Instruct", params_b=70)
    assert sized.layers is None and sized.kv_bytes_per_token_per_rank(1, 1) is None


def test_kv_cache_per_token_counts_this_ranks_layers_and_heads():
    # Llama-3.1-70B: 80 layers, 8 KV heads of 128, bf16. TP 8 PP 2: 40 layers, 1 head per rank.
    assert LLAMA_70B.kv_bytes_per_token_per_rank(8, 2) == 2 * 40 * 1 * 128 * 2
    # TP 16 > 8 KV heads: each rank still holds a whole (replicated) head.
    assert LLAMA_70B.kv_bytes_per_token_per_rank(16, 1) == 2 * 80 * 1 * 128 * 2
    assert sizing.ModelSize.of(None, "x", params_b=7).kv_bytes_per_token_per_rank(1, 1) is None


def test_a_kv_cache_shorter_than_one_sequence_does_not_fit():
    # 8 x L40S 48 GiB at 0.40: 19.2 GiB usable - 16.4 GiB weights - 2 GiB runtime = 0.8 GiB,
    # about 21k tokens at 40 KiB a token: less than Llama's 131072-token context.
    result = sizing.fit(LLAMA_70B, catalog.CATALOG["g6e.48xlarge"], 8, 1, 0.40, None)
    assert result.kv_room_per_rank_gib > 0 and result.context_tokens < 131072
    assert not result.fits and "vLLM refuses to start" in result.reason
    assert sizing.fit(LLAMA_70B, catalog.CATALOG["g6e.48xlarge"], 8, 1, 0.40, 8192).fits


def test_the_smallest_fit_for_70b_is_cheaper_than_anything_else_that_fits():
    option = sizing.smallest_fit(LLAMA_70B, None, 8192)
    assert option is not None
    chosen = catalog.CATALOG[option.instance_type]
    assert sizing.fit(LLAMA_70B, chosen, option.tp, option.pp, None, 8192).fits
    for name in catalog.known_instance_types():
        instance = catalog.CATALOG[name]
        for nodes in range(1, 17):
            if instance.price_per_hour_usd * nodes < option.cost_per_hour:
                assert not sizing.fit(LLAMA_70B, instance, instance.gpus, nodes, None, 8192).fits, (name, nodes)


def test_stage_layers_split_as_vllm_does():
    assert sizing.stage_layers(80, 2) == [(0, 40), (40, 80)]
    # vLLM's get_pp_indices: the remainder goes to the stages before the last.
    assert sizing.stage_layers(24, 5) == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 24)]
    assert sizing.stage_layers(7, 1) == [(0, 7)]


def test_cost_adds_gateway_nat_and_cache_to_the_gpus():
    cost = sizing.cost(catalog.CATALOG["p4d.24xlarge"], 2, "t3.small", 141.2)
    assert cost.gpu_nodes == pytest.approx(2 * 21.958)
    assert cost.per_hour == pytest.approx(2 * 21.958 + 0.0208 + 0.045 + 141.2 * 0.30 / 730)
    assert cost.per_day == pytest.approx(cost.per_hour * 24)


def test_time_to_first_token_terms_show_their_figures():
    terms = {t.name: t for t in sizing.time_to_first_token(LLAMA_70B, P4D, 2, 2)}
    # The node software's terms come from `make bench-install` and say so.
    assert terms["software install"].seconds == pytest.approx(4.40 * 93.8 / 1.01)
    assert "make bench-install" in terms["software install"].assumes
    assert terms["wheel fetch"].seconds == pytest.approx(4400 / 14.6)
    assert "once per lock" in terms["wheel fetch"].assumes
    # Two nodes download disjoint halves at EFS's per-client 500 MiB/s (efs-utils 1.x), and
    # each copies its half to the local NVMe at the same rate while the files land: one
    # term, the slower of the two, not their sum.
    fetch = terms["download+stage"]
    assert "model download" not in terms and "stage copy" not in terms
    assert fetch.seconds == pytest.approx(max(141.2e9 / 2, 70.6e9) / (500 * MIB), rel=1e-3)
    assert "500 MiB/s" in fetch.assumes and "efs-utils v1.36.0" in fetch.assumes
    assert sizing.EFS_PERFORMANCE_PAGE in fetch.assumes and "/opt/dlami/nvme" in fetch.assumes
    assert "overlap" in fetch.assumes
    assert terms["model load"].seconds == pytest.approx(70.6e9 / (2_000_000 * 4096), rel=1e-3)
    assert "local NVMe" in terms["model load"].assumes and "random-read IOPS" in terms["model load"].assumes


def test_a_stack_serving_from_the_cache_pays_the_download_alone():
    no_store = dataclasses.replace(P4D, instance_store_gb=0, instance_store_disks=0)
    terms = {t.name: t for t in sizing.time_to_first_token(LLAMA_70B, no_store, 2, 2)}
    assert "download+stage" not in terms and "stage copy" not in terms
    assert terms["model download"].seconds == pytest.approx(141.2e9 / 2 / (500 * MIB), rel=1e-3)
    assert "no stage copy" in terms["model download"].assumes


def test_warnings_name_what_is_risky():
    big = sizing.fit(LLAMA_70B, catalog.CATALOG["g5.12xlarge"], 4, 1, None, 8192)
    warnings = sizing.warnings_for(LLAMA_70B, catalog.CATALOG["g5.12xlarge"], 4, big)
    assert any("exceed one node's GPU memory" in w for w in warnings)
    assert any(w.startswith("does not fit") for w in warnings)


def test_an_unknown_model_needs_its_size():
    with pytest.raises(ValueError, match="--params-b"):
        sizing.ModelSize.of(None, "org/unknown")
    with pytest.raises(ValueError, match="dtype"):
        sizing.ModelSize.of(None, "org/unknown", params_b=7, dtype="fp12")


def test_the_engine_ready_timeout_is_three_times_load_and_start_with_vllms_floor():
    # prod: each node's engine reads its 70.6 GB stage from local NVMe at 2,000,000 x 4 KiB/s = 8.6 s;
    # start 60 + 2.5 x 70.6 = 236.5 s; 3 x 245.1 s = 735.4 -> 736 s. The copy to NVMe comes
    # before vLLM starts. A 1.5B model: 3 x (3 + 63.9) s is under vLLM's 600 s default.
    assert sizing.engine_ready_timeout_seconds(LLAMA_70B, P4D, 2, 2) == 736
    assert sizing.engine_ready_timeout_for("meta-llama/Llama-3.1-70B-Instruct", P4D, 2) == 736
    small = sizing.ModelSize.of(models.lookup("Qwen/Qwen2.5-1.5B-Instruct"), "Qwen/Qwen2.5-1.5B-Instruct")
    g6 = catalog.CATALOG["g6.xlarge"]
    assert sizing.engine_ready_timeout_seconds(small, g6, 1) == sizing.ENGINE_READY_TIMEOUT_FLOOR_SECONDS == 600


def test_without_a_local_copy_the_engine_timeout_covers_the_whole_model_from_the_cache():
    # 141.2 GB per node at 500 MiB/s = 269.3 s; 3 x (269.3 + 236.5) = 1517.4 -> 1518 s.
    assert sizing.model_load_seconds(LLAMA_70B, NO_NVME_P4D, 2, 2) == pytest.approx(141.2e9 / (500 * MIB))
    assert sizing.engine_ready_timeout_seconds(LLAMA_70B, NO_NVME_P4D, 2, 2) == 1518


def test_a_start_may_be_silent_three_times_its_longest_stage_never_under_vllms_600_seconds():
    """start-vllm's bound on a start without a line in its journal (issue 34 point 5).
    prod: the engine start (236.5 s) is longer than the load from local NVMe (8.6 s):
    3 x 236.5 = 709.5 -> 710 s. Without the local copy the load from the cache (269.3 s)
    is the longest: 3 x 269.3 = 807.9 -> 808 s. A 1.5B model keeps vLLM's 600 s."""
    assert sizing.engine_start_stall_seconds(LLAMA_70B, P4D, 2, 2) == 710
    assert sizing.engine_start_stall_for("meta-llama/Llama-3.1-70B-Instruct", P4D, 2) == 710
    assert sizing.engine_start_stall_seconds(LLAMA_70B, NO_NVME_P4D, 2, 2) == 808
    small = sizing.ModelSize.of(models.lookup("Qwen/Qwen2.5-1.5B-Instruct"), "Qwen/Qwen2.5-1.5B-Instruct")
    assert sizing.engine_start_stall_seconds(small, catalog.CATALOG["g6.xlarge"], 1) == 600
    # One stage's silence never exceeds the whole start vLLM itself allows its engine.
    for instance in (P4D, NO_NVME_P4D):
        assert sizing.engine_start_stall_seconds(LLAMA_70B, instance, 2, 2) <= sizing.engine_ready_timeout_seconds(
            LLAMA_70B, instance, 2, 2
        )


def test_a_model_outside_the_table_is_timed_as_the_largest_the_gpus_could_hold():
    bound = sizing.served_model_size("someone/unknown-model", P4D, 2)
    assert bound.weight_bytes == pytest.approx(2 * 8 * 40 * 2**30) and bound.dtype == "bf16"
    assert sizing.served_model_size("meta-llama/Llama-3.1-70B-Instruct", P4D, 2) == LLAMA_70B
    assert sizing.engine_ready_timeout_seconds(bound, P4D, 2) > sizing.engine_ready_timeout_seconds(LLAMA_70B, P4D, 2)
    # Its stages are estimated from the weight bytes / PP, and say so.
    first, second = sizing.node_shares(bound, 2, 2)
    assert first.bytes == second.bytes == pytest.approx(bound.weight_bytes / 2)
    assert "weight bytes / PP" in first.estimate


# vLLM's own --dtype choices (vllm.config.model.ModelDType): what `vllm serve` accepts.
VLLM_DTYPE_CHOICES = ("auto", "half", "float16", "bfloat16", "float", "float32")

SPELLINGS = [
    # (as a user writes it, the canonical name)
    ("auto", "auto"),
    ("half", "fp16"),
    ("float16", "fp16"),
    ("fp16", "fp16"),
    ("bfloat16", "bf16"),
    ("bf16", "bf16"),
    ("float", "fp32"),
    ("float32", "fp32"),
    ("fp32", "fp32"),
    ("fp8", "fp8"),
    ("int8", "int8"),
    ("int4", "int4"),
    ("BF16", "bf16"),
    (" bfloat16 ", "bf16"),
]


@pytest.mark.parametrize("spelling, canonical", SPELLINGS)
def test_vllms_spellings_and_the_short_ones_name_the_same_dtype(spelling, canonical):
    assert sizing.canonical_dtype(spelling, "--dtype") == canonical


def test_every_canonical_dtype_but_auto_has_a_size():
    canonical = {sizing.canonical_dtype(spelling, "--dtype") for spelling, _ in SPELLINGS}
    assert canonical - {"auto"} == set(models.DTYPE_BYTES)


def test_an_unknown_dtype_names_where_it_came_from_the_value_and_every_accepted_spelling():
    with pytest.raises(ValueError) as caught:
        sizing.canonical_dtype("fp12", "--dtype")
    text = str(caught.value)
    assert "--dtype" in text and "fp12" in text
    for spelling in (
        "auto",
        "half",
        "float16",
        "bfloat16",
        "float",
        "float32",
        "bf16",
        "fp16",
        "fp32",
        "fp8",
        "int8",
        "int4",
    ):
        assert spelling in text.split("accepted:", 1)[1], spelling


@pytest.mark.parametrize("spelling", [*VLLM_DTYPE_CHOICES, "bf16", "fp16", "fp32"])
def test_what_vllm_receives_as_dtype_is_one_of_its_own_choices(spelling):
    assert sizing.vllm_dtype(sizing.canonical_dtype(spelling, "--dtype")) in VLLM_DTYPE_CHOICES


@pytest.mark.parametrize("quantized", ["fp8", "int8", "int4"])
def test_quantized_weight_types_have_no_vllm_dtype(quantized):
    """vLLM's --dtype is the type of unquantized weights and activations; fp8, int8 and int4
    weights come from a quantized checkpoint or --quantization."""
    assert sizing.vllm_dtype(quantized) is None


def test_the_planner_sizes_vllms_spellings_like_the_short_ones():
    for vllm_spelling, short in (("bfloat16", "bf16"), ("half", "fp16"), ("float", "fp32"), ("float32", "fp32")):
        sized = sizing.ModelSize.of(None, "x", params_b=7, dtype=vllm_spelling)
        assert sized.dtype == short and sized.weight_bytes == sizing.ModelSize.of(None, "x", 7, short).weight_bytes


def test_auto_takes_the_models_own_dtype():
    llama = models.lookup("meta-llama/Llama-3.1-70B-Instruct")
    assert sizing.ModelSize.of(llama, "m", dtype="auto").dtype == llama.dtype
    assert sizing.ModelSize.of(None, "x", params_b=7, dtype="auto").dtype == "bf16"


def test_plan_dtype_takes_vllms_spelling_and_names_the_flag_when_it_is_unknown(capsys):
    from cli.__main__ import main

    assert main(["plan", "--stack", "dev", "--json", "--params-b", "7", "--dtype", "bfloat16"]) == 0
    assert '"dtype": "bf16"' in capsys.readouterr().out
    assert main(["plan", "--stack", "dev", "--params-b", "7", "--dtype", "fp12"]) == 2
    error = capsys.readouterr().err
    assert "--dtype 'fp12'" in error and "bfloat16" in error and "Traceback" not in error


# The model's bytes per node (issue 20): what each node pulls from the EFS cache, the copy
# to its local NVMe, the engine's read, and the first download from the Hub.


def prod_spec():
    from pulumi_mocks import stack_config

    from components.spec import load_spec

    config = {k.split(":", 1)[1]: v for k, v in stack_config("prod").items() if k.startswith("vllm-cluster:")}
    return load_spec(config, stack="prod")


def test_with_the_local_copy_each_prod_node_pulls_about_half_the_weights_from_the_cache():
    """TP 8 x PP 2 of the 70B on two p4d.24xlarge: each node copies its stage, about half of
    the 141.2 GB, once, and its 8 workers read that from the local NVMe."""
    loads = sizing.node_loads(LLAMA_70B, P4D, 2, 2)
    assert [load.stages for load in loads] == [(0,), (1,)]
    assert [load.layers for load in loads] == [(0, 40), (40, 80)]
    for load in loads:
        assert load.local and load.efs_bytes == pytest.approx(LLAMA_70B.weight_bytes / 2, rel=0.02)
        assert load.load_bytes == load.efs_bytes and load.load_from == "local NVMe (/opt/dlami/nvme)"
        assert load.efs_mib_s == 500 and load.copy_seconds == pytest.approx(load.efs_bytes / (500 * MIB))
    # The first stage holds the input embedding, the last lm_head: 128256 x 8192 x 2 B each.
    assert "the embedding" in loads[0].stage_estimate and "lm_head" in loads[1].stage_estimate
    assert sum(load.stage_bytes for load in loads) == pytest.approx(LLAMA_70B.weight_bytes)


def test_without_nvme_each_prod_node_pulls_the_whole_weights_from_the_cache():
    """vLLM reads every weight file in every worker whatever its stage: without a local copy
    each node moves all 141.2 GB (once, through its page cache)."""
    loads = sizing.node_loads(LLAMA_70B, NO_NVME_P4D, 2, 2)
    for load in loads:
        assert not load.local and load.copy_seconds == 0
        assert load.efs_bytes == load.load_bytes == pytest.approx(141.2e9)
        assert load.load_from == "the EFS cache" and "every file in every worker" in load.load_source
        assert load.load_seconds == pytest.approx(141.2e9 / (500 * MIB))
        assert "no local NVMe" in load.reason and "EFS cache" in load.reason


def test_a_node_whose_memory_cannot_hold_the_model_reads_it_once_per_worker():
    small_memory = dataclasses.replace(NO_NVME_P4D, memory_gib=64)
    load = sizing.node_loads(LLAMA_70B, small_memory, 2, 2)[0]
    assert load.efs_bytes == pytest.approx(8 * 141.2e9) and "once per worker" in load.load_source


def test_the_efs_rate_follows_the_efs_utils_the_nodes_build(monkeypatch):
    """efs-utils 1.x (stunnel) gets EFS's 500 MiB/s per client; 2.x (efs-proxy) 1,500 MiB/s:
    a bump of versions.EFS_UTILS_VERSION changes the plan."""
    from components import versions

    assert versions.EFS_UTILS_VERSION.startswith("v1.")
    assert sizing.efs_client_mib_s() == 500
    stunnel_copy = sizing.node_loads(LLAMA_70B, P4D, 2, 2)[0].copy_seconds
    monkeypatch.setattr(versions, "EFS_UTILS_VERSION", "v2.1.0")
    assert sizing.efs_client_mib_s() == 1500
    assert "efs-proxy" in sizing.efs_client_rate()[1] and "v2.1.0" in sizing.efs_client_rate()[1]
    loads = sizing.node_loads(LLAMA_70B, P4D, 2, 2)
    assert [load.efs_mib_s for load in loads] == [1500, 1500]
    assert loads[0].copy_seconds == pytest.approx(stunnel_copy / 3)
    # Two nodes writing 1,500 MiB/s each pass the file system's 1 GiB/s of writes (the low end):
    # the download is then bound by the file system.
    assert sizing.model_download(LLAMA_70B, 2).seconds == pytest.approx(141.2e9 / (1024 * MIB))
    assert sizing.engine_ready_timeout_seconds(LLAMA_70B, NO_NVME_P4D, 2, 2) < 1518


@pytest.mark.parametrize("version, major", [("v1.36.0", 1), ("2.3.1", 2), ("v2.0", 2), (" v10.1.0 ", 10)])
def test_efs_utils_release_tags_parse(version, major):
    assert sizing.efs_utils_major(version) == major


@pytest.mark.parametrize("version", ["master", "", "v", "1.x"])
def test_an_efs_utils_version_that_is_not_a_tag_is_refused(version):
    with pytest.raises(ValueError, match="efs-utils version"):
        sizing.efs_client_rate(version)


def test_the_first_download_is_split_over_gang_0s_nodes():
    one = sizing.model_download(LLAMA_70B, 1)
    two = sizing.model_download(LLAMA_70B, 2)
    assert one.part_bytes == LLAMA_70B.weight_bytes and one.seconds == pytest.approx(141.2e9 / (500 * MIB))
    assert two.part_bytes == LLAMA_70B.weight_bytes / 2 and two.seconds == pytest.approx(one.seconds / 2)
    assert "2 nodes in parallel, disjoint files" in two.assumes
    # Past the file system's write rate (1 GiB/s at the low end), more nodes stop helping.
    eight = sizing.model_download(LLAMA_70B, 8)
    assert eight.seconds == pytest.approx(141.2e9 / (1024 * MIB)) and "writes" in eight.assumes


def test_prod_serves_from_local_disk_and_says_why():
    local, reason = sizing.serves_from_local_disk(prod_spec())
    assert local is True
    assert reason == "p4d.24xlarge has 8 x 1000 GB NVMe at /opt/dlami/nvme; each node's stage is ~71 GB"


def test_a_type_without_nvme_serves_from_the_cache_and_says_why():
    spec = dataclasses.replace(prod_spec(), instance=NO_NVME_P4D)
    local, reason = sizing.serves_from_local_disk(spec)
    assert local is False
    assert reason == "p4d.24xlarge has no local NVMe: serving from the EFS cache (each node's stage is ~71 GB)"


def test_a_stage_larger_than_the_nvme_serves_from_the_cache():
    # 1 x 75 GB: 90% of it, 67.5 GB (AWS leaves 10% for over-provisioning), is less than the 70.6 GB stage.
    small_store = dataclasses.replace(P4D, instance_store_gb=75, instance_store_disks=1)
    local, reason = sizing.serves_from_local_disk(dataclasses.replace(prod_spec(), instance=small_store))
    assert local is False
    assert "1 x 75 GB NVMe at /opt/dlami/nvme, too small" in reason and "serving from the EFS cache" in reason
    # 80 GB holds it.
    roomy = dataclasses.replace(P4D, instance_store_gb=80, instance_store_disks=1)
    assert sizing.serves_from_local_disk(dataclasses.replace(prod_spec(), instance=roomy))[0] is True


def test_tied_embeddings_put_the_embedding_on_the_first_and_the_last_stage():
    """Qwen2.5-1.5B ties lm_head to embed_tokens: vLLM's last stage holds embed_tokens too, so
    both stages' files hold the matrix and the two stages together exceed the checkpoint by it."""
    qwen = sizing.ModelSize.of(models.lookup("Qwen/Qwen2.5-1.5B-Instruct"), "Qwen/Qwen2.5-1.5B-Instruct")
    first, last = sizing.node_shares(qwen, 2, 2)
    matrix = 151936 * 1536 * 2
    assert first.bytes + last.bytes == pytest.approx(qwen.weight_bytes + matrix)
    assert "the embedding" in first.estimate and "the embedding" in last.estimate
    # One stage: the checkpoint, the tied matrix counted once.
    [whole] = sizing.node_shares(qwen, 1, 1)
    assert whole.bytes == pytest.approx(qwen.weight_bytes)


def test_a_node_with_several_stages_holds_their_layers_together():
    # PP 4 over 2 nodes (TP 4 on 8 GPUs): node 0 holds stages 0-1, layers 0-39.
    shares = sizing.node_shares(LLAMA_70B, 2, 4)
    assert [(s.stages, s.layers) for s in shares] == [((0, 1), (0, 40)), ((2, 3), (40, 80))]
    assert [s.bytes for s in shares] == pytest.approx([s.bytes for s in sizing.node_shares(LLAMA_70B, 2, 2)])


def test_the_nvme_read_rate_is_sourced_or_labelled_an_estimate():
    rate, source = sizing.nvme_read_rate(P4D)
    assert rate == pytest.approx(2_000_000 * 4096 / MIB) and "EC2 User Guide" in source
    rate, source = sizing.nvme_read_rate(catalog.CATALOG["p5.48xlarge"])
    assert rate == pytest.approx(8 * 250_000 * 4096 / MIB) and source.startswith("estimate")


def test_with_several_workers_each_copies_every_stage_a_worker_may_serve():
    """vLLM orders the nodes after the head by Ray node ID, unknown when the copy runs
    (scripts/lib/model_stage.py node_stages): 4 nodes at PP 4, the head copies stage 0, each
    worker stages 1-3, and the plan counts those bytes."""
    shares = sizing.node_shares(LLAMA_70B, 4, 4)
    assert [s.stages for s in shares] == [(0,), (1,), (2,), (3,)]
    assert [s.copied for s in shares] == [(0,), (1, 2, 3), (1, 2, 3), (1, 2, 3)]
    assert shares[1].layers == (20, 80) and "Ray node ID" in shares[1].estimate
    assert shares[0].bytes + shares[1].bytes == pytest.approx(LLAMA_70B.weight_bytes)
    local, reason = sizing.local_disk_decision(LLAMA_70B, P4D, 4, 4)
    assert local and reason.endswith("the largest node's stages are ~105 GB")


def test_mixtral_holds_the_embedding_and_lm_head_on_every_stage():
    """vLLM's Mixtral builds embed_tokens and lm_head on every stage (mixtral.py): each stage's
    copy holds both matrices beside its half of the layers."""
    mixtral = sizing.ModelSize.of(
        models.lookup("mistralai/Mixtral-8x7B-Instruct-v0.1"), "mistralai/Mixtral-8x7B-Instruct-v0.1"
    )
    first, last = sizing.node_shares(mixtral, 2, 2)
    matrix = 32000 * 4096 * 2
    assert first.bytes == last.bytes == pytest.approx((mixtral.weight_bytes - 2 * matrix) / 2 + 2 * matrix)
    assert "the embedding and lm_head" in first.estimate


@pytest.mark.parametrize(
    "strategy, says",
    [("eager", "eager: whole files, load(f.read())"), (None, "unset, so lazy"), ("lazy", "lazy: get_tensor")],
)
def test_the_loader_line_says_how_the_workers_read_and_that_the_node_reads_once(strategy, says):
    text = sizing.loader_reads(strategy, 8)
    assert says in text and "each of the node's 8 workers reads every weight file" in text
    assert text.endswith("the page cache makes it once per node")
    assert ("prefetch" in text) == (strategy is None)
