"""Agent programs the agent-program tests run: plain `openai` code, as a user writes it (nothing of rlhf)."""

from __future__ import annotations

import asyncio
import re
import time

import openai

CONVERSATIONS: list[tuple[str, list[dict]]] = []  # (task uid, messages) of every `two_turns` attempt, for checks


async def answer_once(task: dict, client: openai.AsyncOpenAI) -> float:
    """One question, one reply: the fraction of the answer's digits its last number has right (1.0: right)."""
    reply = await client.chat.completions.create(model="gpt-4o-mini", messages=task["prompt"])
    numbers = re.findall(r"\d+", reply.choices[0].message.content or "")
    truth = str(task["ground_truth"])
    return sum(a == b for a, b in zip(numbers[-1], truth)) / len(truth) if numbers else 0.0


async def two_turns(task: dict, client: openai.AsyncOpenAI) -> dict:
    """Ask, send back a tool result and a follow-up, ask again; reports its own numbers beside the reward."""
    messages = list(task["prompt"])
    first = await client.chat.completions.create(model="any", messages=messages, temperature=0.0, seed=7,
                                                 max_tokens=5000)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "tool", "content": "result 42"}, {"role": "user", "content": "Are you sure?"}]
    second = await client.chat.completions.create(model="any", messages=messages)
    messages.append({"role": "assistant", "content": second.choices[0].message.content})
    CONVERSATIONS.append((task["uid"], messages))
    return {"reward": float(len(second.choices[0].message.content or "") % 2), "length": len(messages)}


class Moody:
    """One instance per attempt: what it does depends on the task's `extra_info["mood"]`."""

    async def run(self, task: dict, client: openai.AsyncOpenAI):
        mood = task["extra_info"]["mood"]
        messages = list(task["prompt"])
        if mood == "no completion":
            return 0.5
        reply = await client.chat.completions.create(model="m", messages=messages)
        if mood == "raises":
            raise RuntimeError("the agent broke")
        if mood == "hangs":
            time.sleep(30)  # blocks its own event loop: only its thread is held
        if mood == "async hangs":
            await asyncio.sleep(30)
        if mood == "bad return":
            return "yes"
        if mood == "nan":
            return float("nan")
        if mood == "exits":
            raise SystemExit(3)
        if mood == "forks":  # a second, independent question: a new trajectory in the same attempt
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "And 2+2?"}])
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "Thanks."}]
        await client.chat.completions.create(model="m", messages=messages)
        return 1.0
