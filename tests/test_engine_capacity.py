"""components/engine_capacity.py: the requests one gang's engine runs at once."""

import pytest

from components.engine_capacity import gang_max_num_seqs


@pytest.mark.parametrize(
    ("gpu", "memory", "expected"),
    [
        ("NVIDIA L4", 24, 256),
        ("NVIDIA A10G", 24, 256),
        ("NVIDIA A100", 40, 256),
        # vLLM leaves the A100 out of its large defaults even at 80 GB (PR #17885).
        ("NVIDIA A100", 80, 256),
        ("NVIDIA H100", 80, 1024),
        ("NVIDIA H200", 141, 1024),
    ],
)
def test_vllms_default_follows_the_gpu(gpu, memory, expected):
    assert gang_max_num_seqs((), gpu, memory) == expected


def test_the_stacks_own_flag_wins_and_the_last_one_counts():
    assert gang_max_num_seqs(("--max-num-seqs", "64"), "NVIDIA H100", 80) == 64
    assert gang_max_num_seqs(("--max-num-seqs=32", "--max-num-seqs", "48"), "NVIDIA L4", 24) == 48


def test_a_value_vllm_would_refuse_falls_back_to_the_default():
    assert gang_max_num_seqs(("--max-num-seqs", "0"), "NVIDIA L4", 24) == 256
    assert gang_max_num_seqs(("--max-num-seqs",), "NVIDIA L4", 24) == 256
