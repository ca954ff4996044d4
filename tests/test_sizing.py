"""The planner's arithmetic, with cases a user can check by hand."""

import pytest

from components import catalog, models, sizing

LLAMA_70B = sizing.ModelSize.of(models.lookup("meta-llama/Llama-3.1-70B-Instruct"), "meta-llama/Llama-3.1-70B-Instruct")


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
    # 180 boot + 60 efs-utils + 4.40 GB / 14.6 MB/s fetch + 4.40 x 93.8 / 1.01 s install + 90 + 45 + 236
    assert round(sum(t.seconds for t in sizing.time_to_first_token(LLAMA_70B, 2, 70.6))) == 1321


def test_quantized_weights_keep_a_16_bit_kv_cache_unless_fp8_is_asked_for():
    int4 = sizing.ModelSize.of(models.lookup("meta-llama/Llama-3.1-70B-Instruct"), "m", dtype="int4")
    assert int4.kv_bytes_per_token_per_rank(8, 2) == LLAMA_70B.kv_bytes_per_token_per_rank(8, 2)
    import dataclasses

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
    terms = {t.name: t for t in sizing.time_to_first_token(LLAMA_70B, 2, LLAMA_70B.params_b)}
    # The node software's terms come from `make bench-install` and say so.
    assert terms["software install"].seconds == pytest.approx(4.40 * 93.8 / 1.01)
    assert "make bench-install" in terms["software install"].assumes
    assert terms["wheel fetch"].seconds == pytest.approx(4400 / 14.6)
    assert "once per lock" in terms["wheel fetch"].assumes
    assert terms["model download"].seconds == pytest.approx(141.2e9 / (1500 * 2**20), rel=1e-3)
    assert terms["model load"].seconds == pytest.approx(terms["model download"].seconds / 2)
    assert "1500 MiB/s" in terms["model download"].assumes


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
    # prod: each node reads 141.2 GB / 2 at 1500 MiB/s = 44.9 s; start 60 + 2.5 x 70.6 = 236.5 s;
    # 3 x 281.4 s = 844.2 -> 845 s. A 1.5B model: 3 x (2 + 63.9) s is under vLLM's 600 s default.
    assert sizing.engine_ready_timeout_seconds(LLAMA_70B, 2) == 845
    small = sizing.ModelSize.of(models.lookup("Qwen/Qwen2.5-1.5B-Instruct"), "Qwen/Qwen2.5-1.5B-Instruct")
    assert sizing.engine_ready_timeout_seconds(small, 1) == sizing.ENGINE_READY_TIMEOUT_FLOOR_SECONDS == 600


def test_a_model_outside_the_table_is_timed_as_the_largest_the_gpus_could_hold():
    p4d = catalog.CATALOG["p4d.24xlarge"]
    bound = sizing.served_model_size("someone/unknown-model", p4d, 2)
    assert bound.weight_bytes == pytest.approx(2 * 8 * 40 * 2**30) and bound.dtype == "bf16"
    assert sizing.served_model_size("meta-llama/Llama-3.1-70B-Instruct", p4d, 2) == LLAMA_70B
    assert sizing.engine_ready_timeout_seconds(bound, 2) > sizing.engine_ready_timeout_seconds(LLAMA_70B, 2)


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
