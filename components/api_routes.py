"""The API routes the gateway may forward to vLLM, and which of them a stack serves.

Pure Python. The gateway forwards only a stack's routes (spec.api_routes, from
apiRoutes or the model's task), each behind the API key; every other path answers 404
there. vLLM's own key guards only /v1, /v2, /inference and /cohere
(vllm/entrypoints/serve/middleware/authenticate.py), leaving /metrics, /invocations,
/tokenize and admin routes such as /collective_rpc or /sleep open, so the allowlist is
what keeps them private.
"""

from __future__ import annotations

# The routes that do the model's work: a request to one of them may wake stopped gangs.
# vLLM's OpenAI-compatible server (vllm/entrypoints/openai/api_server.py) serves the
# Responses API at /v1/responses for generation models since vLLM 0.10.
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
POOLING_ROUTES = ("/v1/embeddings", "/v1/score", "/v1/rerank")
WORK_ROUTES = GENERATION_ROUTES + POOLING_ROUTES
# Answered by a gang that serves, never a reason to start one.
INFO_ROUTES = ("/v1/models", "/health")
# Off unless apiRoutes names them: they run the tokenizer for whoever holds the key.
TOKENIZER_ROUTES = ("/tokenize", "/detokenize")
KNOWN_ROUTES = WORK_ROUTES + INFO_ROUTES + TOKENIZER_ROUTES

DEFAULT_GENERATION_ROUTES = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/responses", "/health")
DEFAULT_POOLING_ROUTES = ("/v1/models", "/v1/embeddings", "/v1/score", "/v1/rerank", "/health")
# What the stack's own checks send through the gateway on a generation model: the
# readiness command's completion and `vllm-cluster status`'s probe.
STACK_PROBE_ROUTE = "/v1/completions"

# vllm serve's words that make the model a pooling one: --runner pooling, or a
# --convert to a pooling task (vLLM's "Pooling models" docs); --task is their older
# spelling (embed, embedding, classify, score, reward).
_POOLING_WORDS = {
    "--runner": {"pooling"},
    "--convert": {"embed", "classify", "reward"},
    "--task": {"embed", "embedding", "classify", "score", "reward"},
}


def is_pooling(vllm_extra_args: tuple[str, ...] | list[str]) -> bool:
    """Whether vllmExtraArgs make vLLM serve a pooling model (embeddings, scores)."""
    args = list(vllm_extra_args)
    for index, word in enumerate(args):
        flag, _, value = word.partition("=")
        if flag in _POOLING_WORDS:
            if not value and index + 1 < len(args):
                value = args[index + 1]
            if value in _POOLING_WORDS[flag]:
                return True
    return False


def default_routes(vllm_extra_args: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return DEFAULT_POOLING_ROUTES if is_pooling(vllm_extra_args) else DEFAULT_GENERATION_ROUTES
