# The project's entry points. `make test` on a fresh machine sets up and runs every test.
PYTHON ?= python3
# The same virtualenv Pulumi.yaml names, so `pulumi up` and the tests share one install.
VENV := venv
STACK ?= dev

.PHONY: test test-deps lint bench bench-fleet bench-install bench-replicas bench-model bench-metrics bench-gateway-sse bench-cpu-floor local local-down up destroy pulumi-yaml config-reference clean

# pip installs uv (its pin from requirements-dev.txt), and uv the rest: on a new machine
# about half a minute where pip alone took over a minute. pip stays in the venv for `pulumi install`.
UV_PIN := $(shell sed -n 's/^uv==\([^ ]*\).*/\1/p' requirements-dev.txt)
$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_PIN)
	$(VENV)/bin/uv pip install --quiet --python $(VENV)/bin/python --compile-bytecode -r requirements-dev.txt
	touch $@

# The system packages the tests use (nginx, systemd-nspawn, debootstrap, ...): installed
# when run as root, otherwise named; the tests that need a missing one skip, and the
# run ends saying which did not run and how to run them.
test-deps:
	tools/install-test-deps

# The packages first: creating the virtualenv needs python3-venv.
# Three workers: each local fleet's tests (a unit of work, in file order: tests/conftest.py)
# take one from the start, side by side on networks of their own, and every other test runs
# in the third beside them (or in a fleet's worker once its fleet is done). One fleet leaves
# about a core idle while its hosts wait on boots, engines and timers (make bench-cpu-floor):
# the other fleet and the rest of the suite use it.
test: test-deps
	@$(MAKE) --no-print-directory --silent $(VENV)/.installed
	$(VENV)/bin/python -m pytest -n 3

# Lint and format check of every Python file (ruff.toml) and shellcheck of every shell
# script; `venv/bin/ruff format .` fixes the formatting.
SHELL_SCRIPTS := scripts/deploy scripts/destroy scripts/vllm-cluster scripts/pulumi-env.sh \
	scripts/gateway/vllm-cluster-gateway scripts/lib/vllm-cluster-lib.sh scripts/node/vllm-cluster-node \
	scripts/node/vllm-cluster-first-boot scripts/lib/vllm-cluster-remove tools/install-test-deps .ci/run
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/shellcheck --severity=style --external-sources $(SHELL_SCRIPTS)

bench: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_program_mocks.py

# Needs root, systemd-nspawn and debootstrap (as `make test` does for the fleet tests).
bench-fleet: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_fleet.py

bench-install: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_install.py

# Needs what the fleet needs: two gangs of one node each behind the gateway, loaded with
# vLLM's own benchmark client from the fleet's engine environment (about 20 min).
bench-replicas: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_replicas.py

# Needs what the fleet needs: a 2-node and then a 3-node gang, one after the other.
bench-model: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_model.py

# vLLM's and Ray's metric series on one node (the planner's Prometheus sizing), on
# loopback with the fleet's environment and tiny model (about 3 min).
bench-metrics: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_metrics_series.py

# nginx's CPU per server-sent event and memory per TLS stream, on loopback with Debian's
# nginx (the plan's gateway check, components/gateway_capacity.py; about a minute).
bench-gateway-sse: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_gateway_sse.py

# The test suite with the machine's CPU sampled: per module its work, and the floor
# (work / cores) no schedule of that work could beat here. Run with nothing else busy.
bench-cpu-floor: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_cpu_floor.py

# The system serving on this machine, before spending on GPUs: local hosts, the real
# bootstrap and the real vLLM engine (tools/local_target.py). Needs root,
# systemd-nspawn and debootstrap. `make local-down` removes everything it made.
LOCAL_NODES ?= 2
# Gangs of LOCAL_NODES hosts behind the gateway (the stack's replicas).
LOCAL_REPLICAS ?= 1
local: $(VENV)/.installed
	$(VENV)/bin/python tools/local_target.py up --nodes $(LOCAL_NODES) --replicas $(LOCAL_REPLICAS)

local-down: $(VENV)/.installed
	$(VENV)/bin/python tools/local_target.py down

up:
	scripts/deploy $(STACK)

destroy:
	scripts/destroy $(STACK)

pulumi-yaml: $(VENV)/.installed
	$(VENV)/bin/python tools/render_pulumi_yaml.py

# docs/configuration-reference.md from the same keys (tests/test_readme.py fails while they differ).
config-reference: $(VENV)/.installed
	$(VENV)/bin/python tools/render_config_reference.py

clean:
	rm -rf $(VENV) .pytest_cache
