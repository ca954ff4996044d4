"""The local hosts that stand in for the stack's EC2 instances, and the replay of the
stack's remote commands on them as `pulumi up` runs them.

Used by `make local` (tools/local_target.py), the fleet tests (tests/test_fleet*.py)
and the benches (bench/). It is not the product: nothing the stack deploys imports it.

- fleet.py: the hosts themselves (Debian with systemd and sshd, booted with
  systemd-nspawn in network namespaces on one bridge), their cached image, the node
  hosts' image (the node's own install step baked in once per lock), package mirror,
  wheelhouse and virtualenv.
- boot_check.py: the check of each host's boot, which names a unit of the hosts' own
  that failed as the local machinery's fault and boots the host again, once.
- replay.py: every remote command the program declared, run over SSH in the
  program's dependency order, dialled by ssh_dial.py as pulumi-command dials.
- pure_wheel.py: the reproducible wheel of a project in this repository (the GPU
  build's stand-in), built byte for byte the same everywhere, so the node lock's hash
  for it holds; the fleet builds it, and tools/lock_node_env.py locks its hash.
- cluster.py: the whole bring-up: the program under the mock runtime with a stack
  config for these hosts, the hosts started with its user data, the replay, the fake
  Hugging Face hub serving the tiny model, and the cluster's endpoints to call.

The stand-ins for what the hosts lack (nvidia-smi, fi_info, the GPU build of vLLM, the
Hugging Face hub, the units of a slow first boot) are test doubles and stay, clearly
named, in tests/doubles, as does the builder of the tiny model (tests/tiny_model.py).
This package uses them as files, by path: it copies them into the hosts or runs them
as programs, and never imports them, so nothing outside tests/ imports from tests/.
"""
