"""`rlhf serve`: the command line, and (slow) a load test of the real server process on loopback."""

import pytest

from rlhf.cli import main as rlhf
from rlhf.models.loading import load_tokenizer
from rlhf.serve.server import BackgroundServer, app_from_args, parse_args


def test_serve_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as exit:
        rlhf(["serve", "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "--api-key", "--max-tokens-limit", "--max-queue", "--max-batch-size"):
        assert flag in out


def test_flags_and_defaults(monkeypatch):
    monkeypatch.delenv("RLHF_API_KEY", raising=False)
    args = parse_args(["some/model"])
    assert (args.host, args.port, args.api_key, args.torch_threads) == ("127.0.0.1", 8000, None, 1)
    monkeypatch.setenv("RLHF_API_KEY", "from-env")
    assert parse_args(["m"]).api_key == "from-env"
    assert parse_args(["m", "--api-key", "flag", "--max-queue", "3"]).max_queue == 3


def test_chat_template_and_tool_call_parser_flags(tmp_path):
    """`--chat-template FILE --tool-call-parser hermes`: tools reach the prompt through the file's template."""
    openai = pytest.importorskip("openai")
    from helpers import tiny_model_path

    template = tmp_path / "tools.jinja"
    template.write_text(
        "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n"
        "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
    hello = [{"role": "user", "content": "hi"}]
    args = parse_args([tiny_model_path(), "--served-model-name", "tiny", "--chat-template", str(template),
                       "--tool-call-parser", "hermes"])
    with BackgroundServer(app_from_args(args)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        with_tools = client.chat.completions.create(model="tiny", messages=hello, tools=[tool], max_tokens=2)
        plain = client.chat.completions.create(model="tiny", messages=hello, max_tokens=2)
    system = load_tokenizer(tiny_model_path())("<|im_start|>system\nTools: add<|im_end|>\n")["input_ids"]
    assert with_tools.usage.prompt_tokens == plain.usage.prompt_tokens + len(system)
    with pytest.raises(SystemExit, match="--chat-template"):
        app_from_args(parse_args([tiny_model_path(), "--chat-template", str(tmp_path / "missing.jinja")]))


def load_benchmark():
    pytest.importorskip("httpx")
    from helpers import load_file

    return load_file("benchmarks/serve_load.py")


def test_the_benchmark_only_targets_loopback():
    bench = load_benchmark()
    bench.require_loopback("http://127.0.0.1:8000")
    bench.require_loopback("http://localhost:1")
    with pytest.raises(SystemExit):
        bench.require_loopback("http://10.0.0.1:8000")
    assert bench.percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0 and bench.percentile([1.0, 2.0], 0.99) == 2.0


@pytest.mark.slow
def test_concurrent_load_on_the_real_server_process():
    """`rlhf serve` in a subprocess: 64 requests at once all succeed and it stays up, then stops on SIGTERM."""
    result = load_benchmark().run_benchmark(requests=64, concurrency=64, max_tokens=8, deadline_s=240)
    assert result["ok"] == 64 and result["errors"] == {} and result["unfinished"] == 0, result
    assert result["server_alive_after"] and result["batches"] < 64  # requests were batched
