"""An OpenAI-compatible generation server: `rlhf serve MODEL_OR_CHECKPOINT` (see docs/serving.md).

`build_app(engine, model_name, limits)` gives the FastAPI app for any rollout engine
(rlhf.rollout.engine.RolloutEngine: HFEngine, VLLMEngine); `main(argv)` is the command line.
"""

from rlhf.serve.app import ServeLimits, build_app
from rlhf.serve.completion import Generated, generate_rows
from rlhf.serve.server import BackgroundServer, main

__all__ = ["BackgroundServer", "Generated", "ServeLimits", "build_app", "generate_rows", "main"]
