"""An OpenAI-compatible generation server: `rlhf serve MODEL_OR_CHECKPOINT` (see docs/serving.md).

`build_app(engine, model_name, limits)` gives the FastAPI app for any `ServeEngine`;
`HFServeEngine` is the CPU one (the HF rollout engine); `main(argv)` is the command line.
"""

from rlhf.serve.app import ServeLimits, build_app
from rlhf.serve.engine import Generated, HFServeEngine, ServeEngine
from rlhf.serve.server import BackgroundServer, main

__all__ = ["BackgroundServer", "Generated", "HFServeEngine", "ServeEngine", "ServeLimits", "build_app", "main"]
