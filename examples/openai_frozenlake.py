"""FrozenLake played by a plain OpenAI-SDK loop, trained as written.

    python -m rollx.train --config=configs/openai_frozenlake.py

One conversation per episode: the board as the user's message, the model's move as the
reply, the env's next board as the next user message. The only rollx-specific lines are
where it points (`task.base_url`) and how it acts (`task.step`, the env's step).
"""

from __future__ import annotations

import openai


async def play(task):
  client = openai.AsyncOpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
  messages = [{"role": "system", "content": task.system_prompt}] if task.system_prompt else []
  messages.append({"role": "user", "content": task.prompt})
  while True:
    reply = await client.chat.completions.create(model=task.model, messages=messages)
    move = reply.choices[0].message.content or ""
    observation, _, done, _ = await task.step(move)
    if done:
      return None  # the score is the sum of the steps' rewards
    messages += [{"role": "assistant", "content": move}, {"role": "user", "content": observation}]
