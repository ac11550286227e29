"""Adapters that let real RL training frameworks consume agentinfra's rollouts and grades.

One public module per framework, each a small layer on that framework's public API and on
`agentinfra.rollouts` (the service's clients and trajectories); the framework itself is
imported only by its module, so ``import agentinfra.trainers`` needs none of them:

- `agentinfra.trainers.trl`: a rollout function for TRL's `GRPOTrainer`.
- `agentinfra.trainers.slime`: a custom generate function returning slime `Sample`s.
- `agentinfra.trainers.skyrl`: a SkyRL `GeneratorInterface`.
- `agentinfra.trainers.openenv`: an OpenEnv server over agentinfra's environments.

The verifiers environment is its own installable package (`integrations/verifiers/`),
because `vf-eval` and prime-rl load environments by distribution name.

This package may use `rollouts`, `harness`, `environments`, `agent`, `sandbox` and shared
modules; only `cli` imports it.
"""

__all__: list[str] = []
