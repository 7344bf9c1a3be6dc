"""An env worker: the env managers of some env ids, their rollout loops run concurrently.

An `EnvWorker` holds up to `max_env_num_per_worker` env managers; each runs its own
`run_rollout_loop` as an asyncio task, so a slow env (a tool call, a web page) holds
up nobody. Tickets come from the scheduler (`link`: an object with the scheduler's
async methods) and generations from the servers through a RolloutClient. Hosting it
in a Ray actor is rollx.cluster's business.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Dict, List, Sequence

import ml_collections

from rollx import models
from rollx.models import hf
from rollx.rollout.agent_loops import make_agent_loop
from rollx.rollout.scheduler import env_layout
from rollx.serving.client import RolloutClient


def manager_kwargs(config: ml_collections.ConfigDict, manager: str) -> dict:
  m = config[manager]
  infer = config.actor_infer.strategy_args
  train = manager == "train_env_manager"
  sampling = config.actor_infer.generating_args if train else \
      config.actor_infer.val_generating_args
  return dict(
      mode="train" if train else "val", max_new_tokens=sampling.max_new_tokens,
      sequence_length=min(config.sequence_length, infer.max_cache_length),
      max_prompt_length=infer.max_prefill_length,
      step_wise=m.env_manager_type == "step", history_length=m.history_length,
      symmetric_views=tuple(m.get("symmetric_views", ())))


class EnvWorker:

  def __init__(self, config: ml_collections.ConfigDict, manager: str, env_ids: Sequence[int],
               link, server_addresses: Sequence[str], render_env_ids: Sequence[int] = ()):
    layout = {s.env_id: s for s in env_layout(config[manager])}
    tokenizer = hf.load_tokenizer(models.resolve_model_dir(config.pretrain))
    self.client = RolloutClient(
        list(server_addresses),
        restart_timeout_s=config.actor_infer.strategy_args.restart_timeout_s)
    self.link = link
    kwargs = manager_kwargs(config, manager)
    if any(config.custom_envs[layout[i].tag].get("agent_loop") == "program" for i in env_ids):
      # one OpenAI endpoint per worker, in its event loop: its agent programs' model calls
      # (started with the first episode)
      from rollx.serving.openai_endpoint import OpenAIEndpoint
      kwargs["endpoint"] = OpenAIEndpoint(self.client.generate, tokenizer,
                                          model_name=models.model_name(config.pretrain))
    self.managers = [
        make_agent_loop(i, layout[i].tag, config.custom_envs[layout[i].tag].to_dict(), tokenizer,
                        self.client.generate, render=i in set(render_env_ids),
                        end_trajectory=self.client.end_trajectory, **kwargs)
        for i in env_ids]
    self._tasks: List[asyncio.Task] = []
    self.restarted_loops = 0

  async def start(self) -> int:
    """Starts the env loops; again, restarts a loop that ended cancelled (nothing in the
    worker cancels one: a CancelledError that leaked out of a library call), whose env
    would otherwise never play again. A loop that raised stays ended: `status` raises it."""
    if not self._tasks:
      self._tasks = [asyncio.ensure_future(m.run_rollout_loop(self.link)) for m in self.managers]
    for i, task in enumerate(self._tasks):
      if task.cancelled():
        logging.warning("env %d's rollout loop ended cancelled; restarting it",
                        self.managers[i].env_id)
        self.restarted_loops += 1
        self._tasks[i] = asyncio.ensure_future(self.managers[i].run_rollout_loop(self.link))
    return len(self._tasks)

  async def ensure_running(self) -> Dict[str, int]:
    """Starts the loops if they are not running yet, then `status`."""
    await self.start()
    return await self.status()

  async def status(self) -> Dict[str, int]:
    failed = [t for t in self._tasks if t.done() and not t.cancelled() and t.exception()]
    if failed:
      raise failed[0].exception()
    return {"envs": len(self.managers), "running": sum(not t.done() for t in self._tasks),
            "env_errors": sum(m.num_env_errors for m in self.managers),
            "restarted_loops": self.restarted_loops,
            "server_retries": self.client.num_retries,
            "restart_waits": self.client.num_restart_waits}
