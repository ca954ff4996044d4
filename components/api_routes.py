"""The API routes the gateway may forward to vLLM, which of them a stack serves, and the
one request the stack itself sends to see that its model serves (its probe).

Pure Python. The gateway forwards only a stack's routes (spec.api_routes, from
apiRoutes or the model's task), each behind the API key; every other path answers 404
there. vLLM's own key guards only /v1, /v2, /inference and /cohere
(vllm/entrypoints/serve/middleware/authenticate.py), leaving /metrics, /invocations,
/tokenize and admin routes such as /collective_rpc or /sleep open, so the allowlist is
what keeps them private.

What a model serves depends on its task, which vllmExtraArgs state. The facts below are
read from the wheels of vLLM's pinned release (components/versions.py VLLM_VERSION) and
of its security floor (VLLM_MIN_VERSION), which agree, so they hold for every release a
stack may run (tests/test_spec.py stops a new pin until they are read again):
- `--runner pooling` makes the model a pooling one; `--convert embed|classify` adapts a
  generative model to one (vllm/config/model.py: RunnerOption, ConvertOption,
  _get_runner_type, which takes any --convert other than auto/none as --runner pooling).
  `--convert` takes only auto, none, embed and classify: no `reward`. Without either,
  vLLM tells a pooling model from the model's own architecture (_get_default_runner_type).
- The pooling task is `--pooler-config.task` (vllm/config/pooler.py PoolerConfig.task,
  set through vLLM's dotted JSON arguments, vllm/utils/argparse_utils.py), else the
  converted task, else vLLM picks it from the model (ModelConfig.get_pooling_task:
  embed&token_classify, embed, classify, token_embed, token_classify, plugin).
  Whatever vLLM would take from the model's own config, the stack cannot know before
  the model is there: it serves a pooling model whose vllmExtraArgs say both that it is
  one and its task.
- `--task` is no vllm serve option: vllm serve exits with "unrecognized arguments"
  (vllm/engine/arg_utils.py has none; argparse_utils.py's FlexibleArgumentParser.error
  adds the hint to use --runner pooling); the task `score` is gone too ("use classify",
  vllm/tasks.py _REMOVED_POOLING_TASK_MESSAGES).
- The routes by task (vllm/entrypoints/pooling/factories.py register_pooling_api_routers,
  utils.py enable_scoring_api): every pooling task gets /pooling; embed /v1/embeddings
  and the scoring routes (/v1/score, /v1/rerank); classify /classify, and the scoring
  routes only for a model with one label (a cross-encoder reranker); token_embed the
  scoring routes (the pinned release also /v1/embeddings, the floor not); token_classify (reward
  models such as Qwen2ForRewardModel, vllm/model_executor/models/qwen2_rm.py, and token
  classifiers) and plugin nothing but /pooling. No pooling model serves
  /v1/completions, which is why the probe follows the task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# The routes that do the model's work: a request to one of them may wake stopped gangs.
# vLLM's OpenAI-compatible server (vllm/entrypoints/openai/api_server.py) serves the
# Responses API at /v1/responses for generation models since vLLM 0.10.
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
# /classify has no /v1 form in vLLM (vllm/entrypoints/pooling/classify/api_router.py), so
# vLLM's own key does not guard it: the gateway's does, as for every route.
POOLING_ROUTES = ("/v1/embeddings", "/v1/score", "/v1/rerank", "/classify")
WORK_ROUTES = GENERATION_ROUTES + POOLING_ROUTES
# Answered by a gang that serves, never a reason to start one.
INFO_ROUTES = ("/v1/models", "/health")
# Off unless apiRoutes names them: they run the tokenizer for whoever holds the key.
TOKENIZER_ROUTES = ("/tokenize", "/detokenize")
KNOWN_ROUTES = WORK_ROUTES + INFO_ROUTES + TOKENIZER_ROUTES

# What the stack says a model serves: "generate", or the pooling task as vLLM names it.
GENERATE = "generate"
EMBED, CLASSIFY, TOKEN_EMBED = "embed", "classify", "token_embed"
# vLLM's pooling tasks (vllm/tasks.py PoolingTask), served or not by this gateway.
VLLM_POOLING_TASKS = ("embed", "classify", "token_embed", "token_classify", "plugin", "embed&token_classify")
# What vLLM's --convert takes (vllm/config/model.py ConvertOption).
VLLM_CONVERTS = ("auto", "none", "embed", "classify")

DEFAULT_GENERATION_ROUTES = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/responses", "/health")
DEFAULT_POOLING_ROUTES = ("/v1/models", "/v1/embeddings", "/v1/score", "/v1/rerank", "/health")
# Each task's routes when apiRoutes names none: what vLLM serves for it (module docstring).
# A classifier with more than one label has no /v1/score or /v1/rerank: vLLM answers
# those 404 itself, as the gateway would.
TASK_ROUTES = {
    GENERATE: DEFAULT_GENERATION_ROUTES,
    EMBED: DEFAULT_POOLING_ROUTES,
    CLASSIFY: ("/v1/models", "/classify", "/v1/score", "/v1/rerank", "/health"),
    TOKEN_EMBED: DEFAULT_POOLING_ROUTES,
}


@dataclass(frozen=True)
class Probe:
    """The stack's own request that shows a model serves: one small, real, authenticated
    request of the model's task (vllm #16259: /health stays 200 after a Ray worker died).
    The readiness check sends it through the gateway, start-vllm, the watchdog and
    `status` to a head's vLLM, and `status` through the endpoint."""

    route: str
    body: dict
    # How messages name it: "a completion", "an embedding".
    what: str

    def body_json(self) -> str:
        """The body as sent: compact JSON, the model first."""
        return json.dumps(self.body, separators=(",", ":"))


# Each task's probe, with the smallest real work the route takes. The schemas are vLLM's
# (the pinned release and the floor): a completion's prompt and max_tokens
# (vllm/entrypoints/openai/completion/protocol.py); EmbeddingCompletionRequest and
# ClassificationCompletionRequest take `input` (vllm/entrypoints/pooling/base/protocol.py
# CompletionRequestMixin); ScoreTextRequest takes text_1 and text_2
# (vllm/entrypoints/pooling/scoring/protocol.py). max_tokens 1 is also how the idle check
# tells a generation probe from use (scripts/node/vllm-idle-check).
_PROBES = {
    GENERATE: ("/v1/completions", {"prompt": "Hello", "max_tokens": 1}, "a completion"),
    EMBED: ("/v1/embeddings", {"input": "Hello"}, "an embedding"),
    # /classify: served for every classify model, whether or not it has the one label
    # that gives it /v1/score (a cross-encoder), which the stack cannot know in advance.
    CLASSIFY: ("/classify", {"input": "Hello"}, "a classification"),
    # /v1/score: the route every release from 0.22.0 on serves a late-interaction model.
    TOKEN_EMBED: ("/v1/score", {"text_1": "Hello", "text_2": "Hello"}, "a score"),
}
SERVED_TASKS = tuple(_PROBES)
SERVED_POOLING_TASKS = tuple(task for task in SERVED_TASKS if task != GENERATE)


def flag_values(vllm_extra_args: tuple[str, ...] | list[str]) -> dict[str, str]:
    """The last value of each `--flag value` or `--flag=value` among vllmExtraArgs, as
    vLLM's argparse takes the last one."""
    args = list(vllm_extra_args)
    values = {}
    for index, word in enumerate(args):
        if not word.startswith("--"):
            continue
        flag, equals, value = word.partition("=")
        if not equals:
            value = args[index + 1] if index + 1 < len(args) and not args[index + 1].startswith("--") else ""
        values[flag] = value
    return values


def model_task(vllm_extra_args: tuple[str, ...] | list[str]) -> str | None:
    """What the model serves as vllmExtraArgs say it (module docstring): GENERATE, or the
    pooling task of a pooling model (--runner pooling or --convert embed|classify; its task
    --pooler-config.task, else the converted one). None when they leave vLLM to take from
    the model's own config whether it is a pooling model (a --pooler-config.task without
    either) or its task (--runner pooling alone), which the stack cannot read before the
    model is there."""
    values = flag_values(vllm_extra_args)
    runner, convert, task = values.get("--runner"), values.get("--convert"), values.get("--pooler-config.task")
    if runner == "generate":
        return GENERATE
    converted = convert if convert in (EMBED, CLASSIFY) else None
    pooling, task = runner == "pooling" or converted is not None, task or converted
    if pooling and task:
        return task
    return None if pooling or task else GENERATE


def is_pooling(vllm_extra_args: tuple[str, ...] | list[str]) -> bool:
    """Whether vllmExtraArgs make vLLM serve a pooling model (embeddings, scores, classes)."""
    return model_task(vllm_extra_args) != GENERATE


def names_the_removed_task_flag(vllm_extra_args: tuple[str, ...] | list[str]) -> bool:
    """Whether vllmExtraArgs hold --task, which vllm serve refuses (module docstring)."""
    return any(word == "--task" or word.startswith("--task=") for word in vllm_extra_args)


def default_routes(vllm_extra_args: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The routes of the model's task; a task the stack does not serve (refused by
    components/spec/engine_settings.py) gets the pooling defaults."""
    return TASK_ROUTES.get(model_task(vllm_extra_args), DEFAULT_POOLING_ROUTES)


def stack_probe(vllm_extra_args: tuple[str, ...] | list[str], served_model_name: str) -> Probe:
    """The probe of a stack whose model is served as `served_model_name`. Only for a task
    the stack serves (SERVED_TASKS): components/spec/engine_settings.py refuses the others first."""
    task = model_task(vllm_extra_args)
    if task not in _PROBES:
        raise ValueError(
            f"no probe for the task {task!r}: the spec (components/spec/engine_settings.py) refuses such vllmExtraArgs"
        )
    route, fields, what = _PROBES[task]
    return Probe(route, {"model": served_model_name, **fields}, what)
