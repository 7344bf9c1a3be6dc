"""The scalar reward model (rollx.rewards.reward_model) against transformers: a tiny
random AutoModelForSequenceClassification directory scores each sequence as
transformers scores it (float32, 1e-5 relative), batched over mixed lengths; rollx
writes such a directory back and transformers loads the same scores."""

import jax
import numpy as np
import pytest
import torch
import transformers

from rollx import models
from rollx.models import hf
from rollx.rewards.reward_model import RewardModel
from tests.conftest import ROOT
from tests.hf_fixtures import default_trunk_reward_model, make_hf_model

jax.config.update("jax_default_matmul_precision", "highest")

HEAD = "SequenceClassification"


def sequences(n=7, vocab=101, seed=0):
  rng = np.random.default_rng(seed)
  # lengths across buckets; no pad id (0) inside, as transformers would read it as padding
  return [list(rng.integers(1, vocab, int(k))) for k in rng.integers(1, 70, n)]


def transformers_scores(model, seqs):
  with torch.no_grad():  # one sequence at a time: no padding to interpret
    return np.stack([model(torch.tensor([s])).logits[0].numpy() for s in seqs])


@pytest.mark.parametrize("variant,num_labels", [("qwen2_gqa_untied", 1),
                                                ("llama_mha_bias_tied", 3)])
def test_scores_match_transformers(tmp_path, variant, num_labels):
  torch_model, path = make_hf_model(tmp_path, variant, head=HEAD, num_labels=num_labels)
  seqs = sequences()
  want = transformers_scores(torch_model, seqs)
  got = RewardModel(path, batch_size=4).score(seqs)  # 7 rows: a batch and a part batch
  assert got.shape == ((len(seqs),) if num_labels == 1 else (len(seqs), num_labels))
  np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)


def test_transformers_batch_with_padding_agrees(tmp_path):
  """transformers' own batched form (right padding, the last non-pad token scored)."""
  torch_model, path = make_hf_model(tmp_path, head=HEAD, num_labels=1)
  seqs = sequences(4, seed=1)
  width = max(map(len, seqs))
  ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
  with torch.no_grad():
    want = torch_model(ids, attention_mask=(ids != 0).long()).logits[:, 0].numpy()
  np.testing.assert_allclose(RewardModel(path).score(seqs), want, rtol=1e-5, atol=1e-6)


def test_saved_directory_loads_in_transformers_with_the_same_scores(tmp_path):
  _, path = make_hf_model(tmp_path, head=HEAD, num_labels=1)
  reward = RewardModel(path)
  out = hf.save_pretrained(jax.device_get(reward.params), reward.config, str(tmp_path / "out"))
  back = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
  assert type(back).__name__ == "Qwen2ForSequenceClassification"
  seqs = sequences(3, seed=2)
  np.testing.assert_allclose(transformers_scores(back, seqs)[:, 0], reward.score(seqs),
                             rtol=1e-5, atol=1e-6)


def test_the_wrong_kind_of_checkpoint_is_named(tmp_path):
  _, scored = make_hf_model(tmp_path, head=HEAD, num_labels=1)
  with pytest.raises(hf.CheckpointError, match="sequence-classification checkpoint where a "
                                               "policy or critic is expected"):
    models.load_model(scored)
  with pytest.raises(hf.CheckpointError, match="causal LM checkpoint where a reward model"):
    RewardModel(None)  # the shipped default is a policy
  with pytest.raises(ValueError, match="sequence 1 has 0 tokens"):
    RewardModel(scored).score([[1, 2], []])


# -- the rewards a batch learns from (RewardSources) -----------------------------------


def _episodes(seqs, env_rewards):
  from rollx.rollout.types import Sample, Ticket, Trajectory
  return [Trajectory(Ticket(0, "FrozenLake", i // 2, 0, i % 2),
                     [Sample(list(s), [0] + [1] * (len(s) - 1), [-1] * len(s), r)],
                     r, r > 0, 1, 0, "terminated", -1)
          for i, (s, r) in enumerate(zip(seqs, env_rewards))]


def _config(env, reward_model):
  from rollx import config as config_lib
  c = config_lib.default_config()
  c.reward_sources.env, c.reward_sources.reward_model = env, reward_model
  return c


def test_a_batch_learns_from_the_weighted_sources_and_keeps_the_envs_scores(tmp_path):
  from rollx.rewards.reward_model import RewardSources
  from rollx.rollout.types import collate
  _, path = make_hf_model(tmp_path, head=HEAD, num_labels=1)
  reward = RewardModel(path, batch_size=3)
  seqs, env = sequences(4, seed=3), [1.0, 0.0, 0.0, 1.0]
  episodes = _episodes(seqs, env)
  batch = collate(episodes, 128)
  alone = RewardSources(_config(0.0, 1.0), reward)
  scored, metrics = alone.apply(batch)
  model = reward.score(seqs)
  np.testing.assert_allclose(scored.rewards, model, rtol=1e-6)
  np.testing.assert_allclose(scored.episode_scores, model, rtol=1e-6)
  assert [t.score for t in scored.trajectories] == env  # success and scores: the env's
  assert metrics["reward/reward_model"] == pytest.approx(float(model.mean()), rel=1e-6)
  assert metrics["reward/env"] == pytest.approx(0.5)
  assert set(metrics) == {"reward/env", "reward/reward_model", "reward/reward_model/FrozenLake"}
  mixed, _ = RewardSources(_config(2.0, 0.5), reward).apply(batch)
  np.testing.assert_allclose(mixed.rewards, 2.0 * np.array(env) + 0.5 * model, rtol=1e-6)

  # re-collated with more episodes (dynamic sampling): earlier rows are not scored again
  calls = []
  score = reward.score
  reward.score = lambda s: calls.append(len(s)) or score(s)
  alone.apply(collate(episodes + _episodes(sequences(2, seed=4), [0.0, 1.0]), 128))
  assert calls == [2]
  alone.new_step()
  alone.apply(batch)
  assert calls == [2, 4]


def test_without_a_reward_model_the_batch_is_the_envs():
  from rollx.rewards.reward_model import RewardSources
  from rollx.rollout.types import collate
  batch = collate(_episodes(sequences(2), [1.0, 0.0]), 128)
  assert RewardSources(_config(1.0, 1.0)).apply(batch) == (batch, {})


@pytest.mark.parametrize("set_keys, key, match", [
    (dict(reward_pretrain="/nonexistent"), "reward_pretrain", "not a Hugging Face model directory"),
    (dict(reward_sources=dict(reward_model=0.5)), "reward_sources.reward_model",
     "there is no reward model"),
    (dict(reward_batch_size=4), "reward_batch_size", "there is no reward model"),
    (dict(reward_pretrain="REWARD", reward_sources=dict(env=-1.0)), "reward_sources.env",
     "a weight >= 0"),
    (dict(reward_pretrain="REWARD", reward_sources=dict(env=0.0, reward_model=0.0)),
     "reward_sources", "nothing to learn from"),
    (dict(reward_pretrain="REWARD", reward_batch_size=0), "reward_batch_size", ">= 1"),
    (dict(reward_pretrain="POLICY"), "reward_pretrain", "is a causal LM (Qwen2ForCausalLM)"),
    (dict(reward_pretrain="OTHER_VOCAB"), "reward_pretrain", "has vocab_size 101, the policy"),
])
def test_reward_key_errors_name_the_key(tmp_path, set_keys, key, match):
  from rollx import checks, config as config_lib
  dirs = {"REWARD": default_trunk_reward_model(tmp_path / "reward"),
          "POLICY": models.DEFAULT_MODEL_DIR,
          "OTHER_VOCAB": make_hf_model(tmp_path, head=HEAD, num_labels=1)[1]}
  c = config_lib.default_config()
  for k, v in set_keys.items():
    if isinstance(v, dict):
      c[k].update(v)
    else:
      c[k] = dirs.get(v, v)
  with pytest.raises(config_lib.ConfigError) as e:
    checks.validate(c)
  errors = dict(e.value.errors)
  assert key in errors and match in errors[key], errors


def test_step_wise_rows_with_a_reward_model_are_a_named_error(tmp_path):
  from rollx import checks, config as config_lib
  path = default_trunk_reward_model(tmp_path / "reward")
  c = config_lib.load_file(f"{ROOT}/configs/frozenlake.py:multiturn")  # trajectory-wise: fine
  c.reward_pretrain = path
  checks.validate(c)
  c = config_lib.load_file(f"{ROOT}/configs/frozenlake.py")  # step-wise
  c.reward_pretrain = path
  with pytest.raises(config_lib.ConfigError, match="step-wise rows"):
    checks.validate(c)
