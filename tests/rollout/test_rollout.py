"""Env managers, the rollout scheduler and Ray env workers, against a real JetStream server.

The policy behind the server is scripted (rollx.recipes.scripted: a bigram table in
ordinary Qwen2 weights): every response is `<answer>{random action}</answer><eos>`.
"""

import asyncio
import collections
import dataclasses
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import ray
from PIL import Image

import envs
from envs.frozenlake import FrozenLake
from rollx import checks, config as config_lib
from rollx.serving import server as server_lib
from rollx.models import hf
from rollx.recipes import scripted
from rollx.rollout import prompts
from rollx.rollout.env_manager import EnvManager
from rollx import cluster
from rollx.cluster import start_rollout
from rollx.errors import RolloutError
from rollx.rollout.env_worker import manager_kwargs
from rollx.rollout.render import save_episode_frames
from rollx.rollout.scheduler import RolloutScheduler, env_layout, episode_metrics
from rollx.rollout.types import Sample, Ticket, Trajectory, collate
from rollx.serving.client import RolloutClient
from tests.conftest import ROOT
from tests.ray_utils import get_while_progressing, start_local_ray


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
  return scripted.random_action_policy_dir(str(tmp_path_factory.mktemp("scripted")))


def make_config(policy_dir, **manager):
  c = config_lib.default_config()
  c.pretrain = policy_dir
  c.sequence_length = 1024
  c.actor_infer.strategy_args.update(max_concurrent_decodes=32, max_prefill_length=1024,
                                     max_cache_length=1100)
  c.custom_envs.FrozenLake = config_lib.env_entry("FrozenLake", dict(max_steps=4),
                                                  max_tokens_per_step=8)
  c.custom_envs.Sokoban = config_lib.env_entry("Sokoban", dict(max_steps=4),
                                               max_tokens_per_step=8)
  if "Flaky" in manager.get("tags", ()):
    c.custom_envs.Flaky = config_lib.env_entry("FlakyLake", dict(max_steps=3),
                                               max_tokens_per_step=8)
  if "Windy" in manager.get("tags", ()):
    c.custom_envs.Windy = config_lib.env_entry("WindyLake", dict(max_steps=3),
                                               max_tokens_per_step=8)
  c.train_env_manager.update(num_env_groups=4, group_size=4, tags=("FrozenLake", "Sokoban"),
                             max_env_num_per_worker=5)
  c.train_env_manager.update(**manager)
  c.rollout_batch_size = c.train_env_manager.num_env_groups * c.train_env_manager.group_size
  return checks.validate(c)


@pytest.fixture(scope="module")
def server(policy_dir):
  srv = server_lib.server_from_config(make_config(policy_dir))
  yield srv
  srv.stop()


async def collect_local(config, server, batches=1, manager="train_env_manager", **overrides):
  """Scheduler + every env manager in this process (no Ray): for the loop's logic."""
  scheduler = RolloutScheduler(config, manager)
  tokenizer = hf.load_tokenizer(config.pretrain)
  client = RolloutClient([server.address])
  kwargs = {**manager_kwargs(config, manager), **overrides}
  managers = [EnvManager(s.env_id, s.tag, config.custom_envs[s.tag].to_dict(), tokenizer,
                         client.generate, end_trajectory=client.end_trajectory, **kwargs)
              for s in env_layout(config[manager])]
  loops = [asyncio.ensure_future(m.run_rollout_loop(scheduler)) for m in managers]
  results = []
  for _ in range(batches):
    results.append(await scheduler.get_batch(config.rollout_batch_size))
  await scheduler.stop()
  await asyncio.gather(*loops)
  await client.close()
  return scheduler, managers, results


def test_token_exactness_against_server_outputs_and_templates(policy_dir, server):
  config = make_config(policy_dir, num_env_groups=2, group_size=2)
  tokenizer = hf.load_tokenizer(policy_dir)
  client = RolloutClient([server.address])
  served = []

  async def recording_generate(*args, **kwargs):
    gen = await client.generate(*args, **kwargs)
    served.append(list(gen.token_ids))
    return gen

  manager = EnvManager(0, "FrozenLake", config.custom_envs.FrozenLake.to_dict(), tokenizer,
                       recording_generate, sequence_length=1024)
  from rollx.rollout.types import Ticket
  for seed in range(3):
    served.clear()
    traj = asyncio.run(manager.run_episode(Ticket(0, "FrozenLake", 0, seed, seed)))
    (sample,) = traj.samples
    # the sequence is exactly template pieces and server outputs, in order
    pieces, expected_mask = [], []
    for turn, response in zip(traj.transcript, served):
      assert turn["response_ids"] == response
      pieces += turn["prompt_ids"] + response
      expected_mask += [0] * len(turn["prompt_ids"]) + [1] * len(response)
    assert sample.input_ids == pieces and sample.response_mask == expected_mask
    # template pieces are what the prompt builder makes for those observations
    b = manager.builder
    t0 = traj.transcript[0]
    assert t0["prompt_ids"] == b.first_prompt(t0["observation"], 4)
    for prev, turn in zip(traj.transcript, traj.transcript[1:]):
      assert turn["prompt_ids"] == b.continuation(
          turn["observation"], turn["turn"], 4 - prev["turn"], prev["response_ids"])
    # and the whole sequence reads as the chat template's own rendering
    messages = [{"role": "system", "content": b.system},
                {"role": "user", "content": b.turn_text(t0["observation"], 1, 4)}]
    for prev, turn in zip(traj.transcript, traj.transcript[1:]):
      messages += [{"role": "assistant", "content": prev["response"]},
                   {"role": "user", "content": b.turn_text(turn["observation"], turn["turn"],
                                                            4 - prev["turn"])}]
    messages.append({"role": "assistant", "content": traj.transcript[-1]["response"]})
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(sample.input_ids) == rendered.rstrip("\n")
    assert all(r[-1] == tokenizer.eos_token_id for r in served)
    assert traj.num_invalid_actions == 0 and traj.num_turns == len(served)
    # the env's ineffective-move count reaches the trajectory: every move after which the
    # next observation is the same one counts (the last move's is not in the transcript)
    repeats = sum(prev["observation"] == turn["observation"]
                  for prev, turn in zip(traj.transcript, traj.transcript[1:]))
    assert repeats <= traj.num_ineffective_actions <= repeats + 1


class FlakyLake(FrozenLake):
  """Raises on the 2nd step of its first episode (once per process)."""
  failures = 0

  def step(self, action_text):
    if self.num_steps == 1 and FlakyLake.failures == 0:
      FlakyLake.failures += 1
      raise RuntimeError("tool backend timed out")
    return super().step(action_text)


envs.register_env("FlakyLake")(FlakyLake)


class WindyLake(FrozenLake):
  """A lake whose wind would blow one way: no board symmetry (config checks)."""
  SYMMETRIES = ()


envs.register_env("WindyLake")(WindyLake)


def test_ended_episodes_leave_no_keys_values_in_the_server(policy_dir):
  """Every episode's end reaches the server (EnvManager -> RolloutClient.end_trajectory ->
  the EndTrajectory RPC): after a batch of multi-turn episodes no conversation is kept."""
  config = make_config(policy_dir, num_env_groups=2, group_size=2)
  config.actor_infer.strategy_args.prefix_cache_tokens = 4096
  srv = server_lib.server_from_config(config)
  try:
    _, managers, _ = asyncio.run(collect_local(config, srv))
    engine = srv.engine
    deadline = time.time() + 10
    while (engine._slot_of or engine.stored_tokens) and time.time() < deadline:
      time.sleep(0.01)  # (the drops are applied on the server's generate loop)
    assert srv.stats()["reused_tokens"] > 0  # the episodes were conversations
    assert not engine._slot_of and engine.stored_tokens == 0
  finally:
    srv.stop()


def test_env_that_raises_is_reset_counted_and_its_episode_rerun(policy_dir, server):
  config = make_config(policy_dir, num_env_groups=2, group_size=3, tags=("Flaky",))
  scheduler, managers, [(batch, metrics)] = asyncio.run(collect_local(config, server))
  assert FlakyLake.failures == 1 and metrics["rollout/env_errors"] == 1
  assert metrics["rollout/reissued"] >= 1 and sum(m.num_env_errors for m in managers) == 1
  assert len(batch) == 6 and sorted(collections.Counter(batch.group_ids).values()) == [3, 3]
  keys = [(t.ticket.env_id, t.ticket.generation) for t in batch.trajectories]
  assert len(set(keys)) == len(keys)


def test_a_prompt_that_cannot_fit_fails_the_batch_with_the_config_key(policy_dir, server):
  # Before: every episode ended at turn 1 with no sample, and training ran on empty
  # batches. A first prompt that does not fit is a config error: get_batch raises it.
  config = make_config(policy_dir, num_env_groups=2, group_size=2, tags=("FrozenLake",))
  with pytest.raises(RuntimeError, match=r"FrozenLake.*max_prefill_length \(16\)"):
    asyncio.run(collect_local(config, server, max_prompt_length=16))


def test_step_wise_samples_carry_step_rewards_and_anchor_hashes(policy_dir, server):
  config = make_config(policy_dir, num_env_groups=2, group_size=2, env_manager_type="step",
                       history_length=2, tags=("Sokoban",))
  _, _, [(batch, _)] = asyncio.run(collect_local(config, server))
  assert len(batch.trajectories) == 4
  for k, traj in enumerate(batch.trajectories):
    rows = np.flatnonzero(batch.episode_ids == k)
    assert len(rows) == traj.num_turns == len(traj.samples)
    assert list(batch.step_index[rows]) == list(range(traj.num_turns))
    for k, (sample, turn) in enumerate(zip(traj.samples, traj.transcript)):
      assert sample.reward == pytest.approx(turn["reward"]) and sample.step_index == k
      assert sample.anchor == prompts.observation_hash(turn["observation"])
      assert sum(sample.response_mask) == len(turn["response_ids"])
      assert sample.input_ids[-len(turn["response_ids"]):] == turn["response_ids"]
    assert traj.score == pytest.approx(sum(s.reward for s in traj.samples))
  # same level within a group: the first anchor of every episode of a group agrees
  firsts = collections.defaultdict(set)
  for traj in batch.trajectories:
    firsts[traj.ticket.group_id].add(traj.samples[0].anchor)
  assert all(len(a) == 1 for a in firsts.values())


def test_symmetric_views_are_the_steps_seen_turned_as_further_episodes_of_the_group(
    policy_dir, server):
  config = make_config(policy_dir, num_env_groups=2, group_size=2, env_manager_type="step",
                       history_length=1, tags=("FrozenLake",),
                       symmetric_views=("rot180", "transpose"))
  config.custom_envs.FrozenLake.env_config.show_neighbours = True
  _, managers, [(batch, _)] = asyncio.run(collect_local(config, server))
  env, builder = managers[0].env, managers[0].builder
  tokenizer = builder.tokenizer
  played = len(batch.trajectories)
  assert played == 4  # views add rows, not episodes
  moved = {"rot180": {"Left": "Right", "Right": "Left", "Up": "Down", "Down": "Up"},
           "transpose": {"Left": "Up", "Up": "Left", "Right": "Down", "Down": "Right"}}
  for traj in batch.trajectories:
    assert list(traj.views) == ["rot180", "transpose"]
    for view, samples in traj.views.items():
      assert len(samples) == len(traj.samples) == traj.num_turns
      history = []
      for sample, turn in zip(samples, traj.transcript):
        seen, action = env.symmetric_view(turn["observation"], turn["action"], view)
        prompt = builder.step_prompt(seen, turn["turn"], 4 - turn["turn"] + 1, history, 1)
        assert sample.input_ids[:len(prompt)] == prompt
        response = tokenizer.decode(sample.input_ids[len(prompt):], skip_special_tokens=True)
        assert response == f"<answer>{moved[view][turn['action']]}</answer>"
        assert sample.input_ids[-1] == tokenizer.eos_token_id
        assert sample.response_mask == [0] * len(prompt) + [1] * (len(sample.input_ids) - len(prompt))
        assert sample.reward == turn["reward"] and sample.anchor == prompts.observation_hash(seen)
        history.append({"turn_idx": turn["turn"], "observation": seen, "action": action,
                        "reward": turn["reward"]})
    # the first step's board turned half round is the played board upside down and back
    first = traj.transcript[0]["observation"].split("\n")[:4]
    seen = env.symmetric_view(traj.transcript[0]["observation"], "Left", "rot180")[0]
    assert seen.split("\n")[:4] == [row[::-1] for row in first[::-1]]
  # collate: a trajectory's views follow it as further episodes of its group, same score
  row = 0
  for k, traj in enumerate(batch.trajectories):
    for e, samples in enumerate([traj.samples, *traj.views.values()]):
      rows = np.flatnonzero(batch.episode_ids == 3 * k + e)
      assert list(rows) == list(range(row, row + len(samples)))
      assert [list(batch.input_ids[r, :len(s.input_ids)]) for r, s in zip(rows, samples)] == [
          s.input_ids for s in samples]
      assert list(batch.step_index[rows]) == list(range(traj.num_turns))
      assert set(batch.episode_scores[rows]) == {traj.score}
      assert set(batch.group_ids[rows]) == {batch.group_ids[np.flatnonzero(
          batch.episode_ids == 3 * k)[0]]}
      row += len(samples)
  assert row == len(batch) and batch.episode_ids.max() + 1 == 3 * played
  # the shipped advantage path (grpo, group mean, discount, whitening, dropped groups)
  # gives the played rows the advantages they have without views: views change no
  # group's mean or spread, only add rows
  import configs.frozenlake as frozenlake_config
  from rollx.algos import advantages as adv_lib
  shipped = frozenlake_config.get_config()
  rng = np.random.default_rng(0)
  for traj in batch.trajectories:
    rewards = rng.choice([0.0, 0.0, -0.01, 1.0], size=traj.num_turns)
    for samples in (traj.samples, *traj.views.values()):
      for sample, reward in zip(samples, rewards):
        sample.reward = float(reward)
    traj.score = float(rewards.sum())
  with_views = collate(batch.trajectories, config.sequence_length)
  plain = collate([dataclasses.replace(t, views={}) for t in batch.trajectories],
                  config.sequence_length)
  adv_views, _ = adv_lib.for_batch(with_views, {"response_mask": with_views.response_mask},
                                   shipped)
  adv_plain, _ = adv_lib.for_batch(plain, {"response_mask": plain.response_mask}, shipped)
  assert np.abs(adv_plain).max() > 0.1
  played_rows = np.isin(with_views.episode_ids, np.arange(0, 3 * played, 3))
  np.testing.assert_allclose(adv_views[played_rows], adv_plain, rtol=0, atol=1e-6)


def test_symmetric_views_config_errors_name_the_key(policy_dir):
  bad = [(dict(symmetric_views=("mirror",)), "unknown board symmetry 'mirror'"),
         (dict(symmetric_views=("rot180",), env_manager_type="trajectory"), "step-wise"),
         (dict(symmetric_views=("rot180",), env_manager_type="step",
               tags=("FrozenLake", "Windy")),
          "env 'Windy' (WindyLake) has no board symmetry ['rot180']")]
  for manager, message in bad:
    with pytest.raises(config_lib.ConfigError, match=re.escape(message)) as e:
      make_config(policy_dir, **manager)
    assert "train_env_manager.symmetric_views" in str(e.value)
  config = make_config(policy_dir, tags=("FrozenLake",))
  config.val_env_manager.update(env_manager_type="step", symmetric_views=("rot180",))
  with pytest.raises(config_lib.ConfigError, match="val_env_manager.symmetric_views"):
    checks.validate(config)


def test_redundancy_keeps_first_group_size_and_filter_keeps_high_std(policy_dir, server):
  config = make_config(policy_dir, num_env_groups=4, group_size=2, group_size_redundancy=1,
                       group_filter_ratio=0.5, tags=("FrozenLake",))
  config.rollout_batch_size = 4
  scheduler, _, results = asyncio.run(collect_local(config, server, batches=2))
  for batch, metrics in results:
    assert len(batch) == 4 and sorted(collections.Counter(batch.group_ids).values()) == [2, 2]
    assert metrics["rollout/filtered_groups"] >= 2
  assert scheduler.counters["dropped_redundant"] >= 1
  assert len(env_layout(config.train_env_manager)) == 12  # 4 groups x (2 + 1)


def test_episode_metrics_per_tag_by_hand():
  def traj(tag, score, success, turns, invalid, finish, ineffective=0, actions=(), kinds=()):
    transcript = [{"action": a, "valid": a is not None} for a in actions]
    for turn, kind in zip(transcript, kinds):
      turn["kind"] = kind
    return Trajectory(ticket=Ticket(0, tag, 0, 0, 0), samples=[], score=score,
                      success=success, num_turns=turns, num_invalid_actions=invalid,
                      finish=finish, start_version=0, num_ineffective_actions=ineffective,
                      transcript=transcript)
  metrics = episode_metrics([
      traj("FrozenLake", 1.0, True, 2, 0, "terminated", actions=("Right", "Down")),  # reached G
      traj("FrozenLake", 0.0, False, 3, 1, "terminated",
           actions=("Down", None, "Down")),  # an invalid answer, then into a hole
      traj("FrozenLake", -0.01, False, 10, 1, "truncated", 8),  # pressed into a wall
      traj("FrozenLake", 0.0, False, 5, 0, "length"),  # out of tokens
      traj("Sokoban", 10.9, True, 4, 0, "terminated"),
      # an env that names its actions' kinds: shares by kind, not by verb
      traj("WebShop", 0.5, False, 4, 0, "terminated",
           actions=("search[red mug]", "click[B00001]", "click[red]", "click[Buy Now]"),
           kinds=("search", "product", "option", "buy"))])
  assert metrics["FrozenLake/success"] == 0.25
  assert metrics["FrozenLake/score_mean"] == pytest.approx(0.99 / 4)
  assert metrics["FrozenLake/score_min"] == -0.01 and metrics["FrozenLake/score_max"] == 1.0
  assert metrics["FrozenLake/episode_length"] == 5.0
  assert metrics["FrozenLake/invalid_action_rate"] == 2 / 20
  assert metrics["FrozenLake/ineffective_action_rate"] == 8 / 20
  assert metrics["FrozenLake/truncated_rate"] == 0.5
  assert metrics["FrozenLake/out_of_context_rate"] == 0.25  # the "length" one only
  assert metrics["FrozenLake/num_episodes"] == 4
  assert metrics["Sokoban/truncated_rate"] == 0.0 and metrics["Sokoban/success"] == 1.0
  assert metrics["Sokoban/out_of_context_rate"] == 0.0
  # shares of the valid actions in the transcripts (the invalid answer is not one)
  assert metrics["FrozenLake/action_share/Down"] == 3 / 4
  assert metrics["FrozenLake/action_share/Right"] == 1 / 4
  assert not any(k.startswith("Sokoban/action_share") for k in metrics)  # no transcript
  assert {k: v for k, v in metrics.items() if k.startswith("WebShop/action_share")} == {
      f"WebShop/action_share/{kind}": 1 / 4 for kind in ("search", "product", "option", "buy")}


# -- Ray ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
  start_local_ray()
  yield
  ray.shutdown()


def test_env_workers_run_at_the_trainers_priority(policy_dir, server, ray_cluster):
  # Ray's default nice 15 starved them on busy cores (a restart took minutes)
  config = make_config(policy_dir, num_env_groups=1, group_size=2, tags=("FrozenLake",))
  rollout = start_rollout(config, "train_env_manager", [server.address])
  try:
    niceness = ray.get(rollout.workers[0].__ray_call__.remote(lambda worker: os.nice(0)))
    assert niceness == os.nice(0)
  finally:
    rollout.stop()


def test_ray_batches_are_whole_groups_on_shared_levels_with_the_tag_partition(
    policy_dir, server, ray_cluster):
  config = make_config(policy_dir, num_groups_partition=(3, 1))
  rollout = start_rollout(config, "train_env_manager", [server.address])
  try:
    assert len(rollout.workers) == 4  # ceil(4 groups x 4 envs / 5 per worker)
    for _ in range(2):
      batch, metrics = rollout.get_batch(16)
      assert len(batch) == 16 and batch.input_ids.shape == (16, 1024)
      by_group = collections.defaultdict(list)
      for t in batch.trajectories:
        by_group[(t.ticket.group_id, t.ticket.generation)].append(t)
      assert sorted(len(v) for v in by_group.values()) == [4, 4, 4, 4]
      for (group_id, _), ts in by_group.items():
        assert len({t.ticket.seed for t in ts}) == 1
        assert len({t.transcript[0]["observation"] for t in ts}) == 1
        assert {t.ticket.tag for t in ts} == {"FrozenLake" if group_id < 3 else "Sokoban"}
      assert metrics["FrozenLake/num_episodes"] == 12 and metrics["Sokoban/num_episodes"] == 4
      assert metrics["FrozenLake/invalid_action_rate"] == 0.0
  finally:
    rollout.stop()


def test_async_mode_overlaps_training_and_respects_staleness(policy_dir, server, ray_cluster):
  config = make_config(policy_dir, num_env_groups=4, group_size=2, tags=("FrozenLake",))
  config.async_generation_ratio = 1.0
  params = server.engine.params_holder.get()[1]
  rollout = start_rollout(config, "train_env_manager", [server.address])
  try:
    rollout.get_batch(8)
    for version in range(1, 4):
      before = ray.get(rollout.scheduler.metrics.remote([]))["rollout/trajectories"]
      time.sleep(1.5)  # a simulated train step: the env loops must keep going
      during = ray.get(rollout.scheduler.metrics.remote([]))["rollout/trajectories"]
      assert during > before, "no trajectory finished while the trainer was busy"
      server.update_params(params, version)  # weight sync: same weights, new version
      rollout.set_version(version)
      batch, metrics = rollout.get_batch(8)
      versions = batch.policy_versions
      assert len(batch) == 8 and versions.min() >= version - 1, (version, versions)
      assert metrics["rollout/staleness_max"] <= 1
      # the loops ran ahead by at most one batch: nothing was generated to be thrown away
      assert metrics.get("rollout/dropped_stale_groups", 0) == 0
      assert metrics["rollout/trajectories"] == 8 * (version + 1)
  finally:
    rollout.stop()
    server.update_params(params, 0)


def test_killing_an_env_worker_mid_collection_still_gives_a_full_unique_batch(
    policy_dir, server, ray_cluster):
  config = make_config(policy_dir, num_env_groups=4, group_size=3, tags=("Sokoban",),
                       max_env_num_per_worker=6)
  config.custom_envs.Sokoban.env_config.max_steps = 8
  config.rollout_batch_size = 12
  rollout = start_rollout(config, "train_env_manager", [server.address])
  try:
    rollout.get_batch(12)  # everything is up
    victim = rollout.workers[0]
    pid = ray.get(victim.pid.remote())
    threading.Timer(0.3, lambda: ray.kill(victim, no_restart=False)).start()
    batch, metrics = get_while_progressing(lambda: rollout.get_batch(12), rollout)
    assert len(batch) == 12
    keys = [(t.ticket.env_id, t.ticket.generation) for t in batch.trajectories]
    assert len(set(keys)) == 12
    assert sorted(collections.Counter(batch.group_ids).values()) == [3, 3, 3, 3]
    assert ray.get(victim.pid.remote(), timeout=120) != pid  # restarted by Ray
    # and the restarted worker keeps serving
    batch, _ = get_while_progressing(lambda: rollout.get_batch(12), rollout)
    assert len(batch) == 12
  finally:
    rollout.stop()


def two_worker_rollout(policy_dir, server, **config):
  """2 FrozenLake groups of 3 on two env workers (env ids 0-2 and 3-5), batches of 6."""
  c = make_config(policy_dir, num_env_groups=2, group_size=3, tags=("FrozenLake",),
                  max_env_num_per_worker=3)
  c.rollout_batch_size = 6
  c.update(config)
  return start_rollout(c, "train_env_manager", [server.address])


def test_an_env_worker_dead_for_good_ends_get_batch_with_an_error_naming_it(
    policy_dir, server, ray_cluster, monkeypatch):
  # its envs' tickets would stay outstanding: without the check the batch waits forever
  monkeypatch.setattr(cluster, "WORKER_CHECK_S", 1.0)
  rollout = two_worker_rollout(policy_dir, server)
  try:
    rollout.get_batch(6)
    ray.kill(rollout.workers[1], no_restart=True)
    start = time.monotonic()
    with pytest.raises(RolloutError, match=re.escape("env worker 1 (env ids [3, 4, 5]) is "
                                                     "dead and will not restart")):
      rollout.get_batch(6)
    assert time.monotonic() - start < 60
  finally:
    rollout.stop()


@pytest.mark.parametrize("how", ["never_started", "ended_cancelled"])
def test_a_worker_whose_loops_do_not_run_is_started_by_the_trainer_waiting_for_a_batch(
    policy_dir, server, ray_cluster, monkeypatch, how):
  # never_started: a restarted worker whose constructor's call to start was lost;
  # ended_cancelled: loops that a CancelledError from a library call ended
  monkeypatch.setattr(cluster, "WORKER_CHECK_S", 1.0)
  rollout = two_worker_rollout(policy_dir, server)
  try:
    rollout.get_batch(6)

    def stop_loops(worker):
      for task in worker._tasks:
        task.get_loop().call_soon_threadsafe(task.cancel)
      if how == "never_started":
        worker._tasks = []

    ray.get(rollout.workers[0].__ray_call__.remote(stop_loops))
    deadline = time.time() + 30
    while ray.get(rollout.workers[0].status.remote())["running"]:
      assert time.time() < deadline
      time.sleep(0.1)
    batch, _ = get_while_progressing(lambda: rollout.get_batch(6), rollout, stall_s=60)
    assert len(batch) == 6
    assert sorted(collections.Counter(batch.group_ids).values()) == [3, 3]
    status = ray.get(rollout.workers[0].status.remote())
    assert status["running"] == 3
    assert status["restarted_loops"] == (3 if how == "ended_cancelled" else 0)
  finally:
    rollout.stop()


@pytest.mark.parametrize("async_ratio", [0.0, 1.0])
def test_killing_an_env_worker_between_batches_still_gives_full_unique_batches(
    policy_dir, server, ray_cluster, async_ratio):
  # its loops wait in the scheduler between sync batches (async: at the staleness bound)
  rollout = two_worker_rollout(policy_dir, server, async_generation_ratio=async_ratio)
  try:
    rollout.get_batch(6)
    time.sleep(0.5)  # the loops are back waiting for tickets
    victim = rollout.workers[0]
    pid = ray.get(victim.pid.remote())
    ray.kill(victim, no_restart=False)
    deadline = time.time() + 120
    while True:  # restarted by Ray, its loops waiting for tickets
      try:
        if ray.get(victim.pid.remote(), timeout=60) != pid:
          break
      except ray.exceptions.ActorUnavailableError:
        pass
      assert time.time() < deadline
      time.sleep(0.5)
    time.sleep(0.5)
    seen = set()
    for _ in range(2):
      batch, _ = get_while_progressing(lambda: rollout.get_batch(6), rollout)
      keys = {(t.ticket.env_id, t.ticket.generation) for t in batch.trajectories}
      assert len(batch) == 6 and len(keys) == 6 and not keys & seen
      assert sorted(collections.Counter(batch.group_ids).values()) == [3, 3]
      seen |= keys
  finally:
    rollout.stop()


@pytest.mark.parametrize("async_ratio", [0.0, 1.0])
def test_a_ticket_taken_by_a_dead_workers_waiting_call_reaches_its_restarted_worker(
    policy_dir, async_ratio):
  # An env's loop waits in next_ticket between batches; its worker dies and Ray restarts
  # it, whose loop waits too. The dead incarnation's call is still queued in the
  # scheduler and wakes first: the ticket it takes must reach the live loop.
  config = make_config(policy_dir, num_env_groups=1, group_size=2, tags=("FrozenLake",))
  config.async_generation_ratio = async_ratio
  config.rollout_batch_size = 2

  async def run():
    scheduler = RolloutScheduler(config, "train_env_manager")

    def episode(ticket):
      sample = Sample(input_ids=[5, 6], response_mask=[0, 1], token_versions=[-1, 0],
                      reward=0.0)
      return Trajectory(ticket=ticket, samples=[sample], score=0.0, success=False,
                        num_turns=1, num_invalid_actions=0, finish="terminated",
                        start_version=0)

    async def play(env_id):  # a loop that finishes whatever ticket it gets
      ticket = await scheduler.next_ticket(env_id)
      await scheduler.put(episode(ticket))
      return ticket

    first = asyncio.ensure_future(scheduler.get_batch(2))
    await asyncio.gather(play(0), play(1))
    await first
    dead = asyncio.ensure_future(scheduler.next_ticket(0))  # the old incarnation's call
    await asyncio.sleep(0.01)
    live = asyncio.ensure_future(scheduler.next_ticket(0))  # the restarted worker's
    other = asyncio.ensure_future(play(1))
    batch = asyncio.ensure_future(scheduler.get_batch(2))
    await asyncio.sleep(0.05)
    assert dead.done()  # woke first and took the ticket, for nobody
    ticket = await asyncio.wait_for(live, 5)
    assert ticket == dead.result()
    await scheduler.put(episode(ticket))
    await other
    got, _ = await asyncio.wait_for(batch, 5)
    assert sorted((t.ticket.env_id, t.ticket.generation) for t in got.trajectories) == [
        (0, 1), (1, 1)]
    await scheduler.stop()

  asyncio.run(run())


def test_validation_rollout_saves_frames(policy_dir, server, ray_cluster, tmp_path):
  config = make_config(policy_dir)
  config.val_env_manager.update(num_env_groups=4, group_size=1, tags=("FrozenLake", "Sokoban"))
  rollout = start_rollout(config, "val_env_manager", [server.address], render_env_ids=(0, 2))
  try:
    batch, metrics = rollout.get_batch(4)
  finally:
    rollout.stop()
  assert len(batch) == 4 and {"FrozenLake/success", "Sokoban/score_mean"} <= set(metrics)
  gifs = save_episode_frames(batch.trajectories, str(tmp_path))
  assert len(gifs) == 2
  for gif in gifs:
    traj = next(t for t in batch.trajectories if t.frames and
                os.path.basename(os.path.dirname(gif)).startswith(t.ticket.tag))
    with Image.open(gif) as image:
      assert image.n_frames >= 2
    pngs = [f for f in os.listdir(os.path.dirname(gif)) if f.endswith(".png")]
    assert len(pngs) == traj.num_turns + 1  # the reset frame, then one per step


def test_play_cli_human_and_bad_env():
  answers = "<answer>Right</answer>\nno idea\n" + "<answer>Down</answer>\n" * 10
  result = subprocess.run(
      [sys.executable, "-m", "rollx.play", "--config=configs/frozenlake.py", "--env=FrozenLake",
       "--policy=human"], input=answers, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert "[prompt]\n<|im_start|>user\n" in out and "[action] Right" in out  # grid alone
  assert "[response] 'no idea'" in out and "[action] INVALID   [reward] -0.01" in out
  assert "===== score" in out
  bad = subprocess.run([sys.executable, "-m", "rollx.play", "--config=configs/frozenlake.py",
                        "--env=Nope"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert bad.returncode != 0 and "--env='Nope' is not a custom_envs tag" in bad.stderr
  assert len([l for l in bad.stderr.splitlines() if l.strip()]) == 1


def test_play_caps_a_turn_as_the_rollouts_do():
  # a turn's cap: the env's max_tokens_per_step and the sampling's max_new_tokens, the
  # train or the validation one, as the Ray env workers apply them
  from configs import frozenlake
  from rollx import play
  config = frozenlake.get_config()
  config.actor_infer.generating_args.max_new_tokens = 3
  config.actor_infer.val_generating_args.max_new_tokens = 5
  config = checks.validate(config)
  assert config.custom_envs.FrozenLake.max_tokens_per_step > 5
  assert play.local_manager(config, "FrozenLake", policy="human").max_tokens == 3
  assert play.local_manager(config, "FrozenLake", policy="human", val=True).max_tokens == 5


def test_play_cli_with_the_local_model():
  result = subprocess.run(
      [sys.executable, "-m", "rollx.play", "--config=configs/frozenlake.py", "--env=FrozenLake",
       "--policy=model", "--val", "--config.custom_envs.FrozenLake.env_config.max_steps=2"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  # the greedy policy may step into a hole on its first move (the shipped model decides)
  turns = int(re.search(r"success \w+, (\d+) turns", result.stdout).group(1))
  assert 1 <= turns <= 2 and result.stdout.count("[response]") == turns, result.stdout
  assert f"----- turn {turns} -----" in result.stdout
  assert "ended: truncated" in result.stdout or "ended: terminated" in result.stdout


@pytest.mark.parametrize("response", ["<answer>Ri", "<answer>Right</answer>"])
def test_a_response_cut_off_without_eos_is_closed_by_the_continuation(response):
  # the server stopped at max tokens: no EOS was generated, so the template's end of
  # message comes from the continuation, and the whole sequence still reads as the
  # chat template's rendering of the conversation
  from rollx.models import DEFAULT_MODEL_DIR
  tokenizer = hf.load_tokenizer(DEFAULT_MODEL_DIR)
  b = prompts.PromptBuilder(tokenizer, "Reach G.")
  first = b.first_prompt("P_G", 4)
  cut = tokenizer.encode(response, add_special_tokens=False)
  assert tokenizer.eos_token_id not in cut
  ended = cut + [tokenizer.eos_token_id]
  for generated in (cut, ended):
    ids = first + generated + b.continuation("_PG", 2, 3, generated)
    messages = [{"role": "system", "content": b.system},
                {"role": "user", "content": b.turn_text("P_G", 1, 4)},
                {"role": "assistant", "content": response},
                {"role": "user", "content": b.turn_text("_PG", 2, 3)}]
    want = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(ids) == want
    assert ids[:len(first) + len(generated)] == first + generated  # generated ids verbatim
