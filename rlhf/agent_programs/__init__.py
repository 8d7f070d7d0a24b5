"""Black-box agents in the RL loop: an unmodified OpenAI-client agent program as a rollout producer.

- `AgentProgramRollout` (rlhf.agent_programs.rollout): runs the user's `async def run(task, client)` for every
  task x n attempts against the live policy, and returns their recorded trajectories as a rollout Batch.
- `LiveGateway` (rlhf.agent_programs.gateway): `rlhf serve --sessions`'s recording gateway on the trainer's
  `generate`, reached in-process or over loopback HTTP.
- `attempt_function`, `outcome` (rlhf.agent_programs.program): what an agent program may be and return.

See docs/agents.md, "Train your own agent program".
"""

from rlhf.agent_programs.gateway import LiveGateway
from rlhf.agent_programs.program import Outcome, attempt_function, outcome
from rlhf.agent_programs.rollout import AgentProgramRollout

__all__ = ["AgentProgramRollout", "LiveGateway", "Outcome", "attempt_function", "outcome"]
