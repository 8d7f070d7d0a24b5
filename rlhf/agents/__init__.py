"""Multi-turn, tool-using rollouts: environments, tools, tool-call parsers, token-exact trajectories.

See docs/agents.md. The pieces, each usable alone:
- `Tool`, `ToolCall`, `ToolResult` (rlhf.agents.tools): typed functions with schemas from their signatures.
- `HermesParser`, `PythonCallParser`, `CodeBlockParser` (rlhf.agents.parsers): tool-call formats.
- `Environment`, `StepResult`, `Action`, `ToolEnvironment`, `environment_reward` (rlhf.agents.environment).
- `ChatRenderer`, `Trajectory` (rlhf.agents.trajectory): token-in/token-out conversations with a loss mask.
- `trajectory_batch` (rlhf.agents.batch): trajectories as the rollout `Batch`.
- `AgentRollout` (rlhf.agents.rollout): the multi-turn rollout producer for `RLTrainer(rollout=...)`.
- `check_template` (rlhf.agents.template_check): is a chat template append-only for tool conversations?
"""

from rlhf.agents.batch import trajectory_batch
from rlhf.agents.environment import Action, Environment, StepResult, ToolEnvironment, environment_reward
from rlhf.agents.parsers import CodeBlockParser, HermesParser, ParsedTurn, PythonCallParser, ToolCallParser
from rlhf.agents.rollout import AgentRollout, agent_metrics
from rlhf.agents.tools import Tool, ToolCall, ToolResult
from rlhf.agents.trajectory import ChatRenderer, TemplateError, Trajectory

__all__ = [
    "Action", "AgentRollout", "ChatRenderer", "CodeBlockParser", "Environment", "HermesParser", "ParsedTurn",
    "PythonCallParser", "StepResult", "TemplateError", "Tool", "ToolCall", "ToolCallParser", "ToolEnvironment",
    "ToolResult", "Trajectory", "agent_metrics", "environment_reward", "trajectory_batch",
]
