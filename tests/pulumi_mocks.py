"""The tests' name for the mock runtime harness, which lives in cli/mock_runtime.py
because the planner (`scripts/vllm-cluster plan`) runs the program with it too."""

from cli.mock_runtime import (  # noqa: F401
    PROJECT,
    ROOT,
    STACKS_DIR,
    MockCloud,
    ProgramRun,
    ProjectConfigError,
    apply_project_config,
    run_program,
    run_stack,
    stack_config,
    stack_names,
    unsecret,
)
