"""The shipped default model directory: offline, HF-format, covers the env prompts."""

import collections

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import envs
from envs import sokoban
from rollx import checks, config as config_lib, models
from tests.conftest import ROOT
from rollx.models import hf, llm
from rollx.recipes import make_default, warm_start
from rollx.rollout import prompts


def test_default_dir_loads_through_the_hf_path_offline():
  loaded = models.load_model(None)
  assert loaded.model_dir == models.DEFAULT_MODEL_DIR
  assert 2e5 < loaded.config.num_params < 10e6
  tokenizer = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)
  assert len(tokenizer) <= loaded.config.vocab_size
  assert loaded.config.eos_token_id == tokenizer.eos_token_id
  ref = transformers.AutoModelForCausalLM.from_pretrained(models.DEFAULT_MODEL_DIR,
                                                          local_files_only=True).eval()
  ids = np.random.default_rng(0).integers(0, len(tokenizer), (2, 40))
  with torch.no_grad():
    expected = ref(torch.tensor(ids)).logits.numpy()
  got = np.asarray(llm.forward(loaded.model, loaded.params, jnp.asarray(ids)))
  assert np.abs(got - expected).max() / np.abs(expected).max() < 1e-5


def test_tokenizer_covers_env_prompts_and_chat_template():
  tokenizer = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)
  for env_type, cfg in [("FrozenLake", {})] + [("Sokoban", v) for v in sokoban.VARIANTS.values()]:
    env = envs.make_env(env_type, cfg)
    obs, _ = env.reset(seed=123)
    assert tokenizer.decode(tokenizer.encode(obs)) == obs
    assert len(tokenizer.encode(obs)) == len(obs)  # one token per grid cell / newline
  # chat roles are whole tokens: they are in every step-wise sample
  for role in ("system", "user", "assistant"):
    assert len(tokenizer.encode(f"<|im_start|>{role}\n")) == 3, role
    turn = prompts.TURN_TEMPLATE.format(turn_idx=3, observation=obs, actions_left=7,
                                        max_response_length=8)
    assert tokenizer.decode(tokenizer.encode(turn)) == turn
    words = turn.replace(obs, "")
    for text in (env.instructions, words):  # prose: merges learned on env text
      ids = tokenizer.encode(text)
      assert tokenizer.decode(ids) == text
      assert len(ids) < len(text.encode()) / 2.5
  for action in ("Left", "Down", "Right", "Up"):
    ids = tokenizer.encode(f"<answer>{action}</answer>")
    assert tokenizer.convert_ids_to_tokens(ids) == ["<answer>", action, "</answer>"]
  chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                       add_generation_prompt=True, tokenize=False)
  assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def rebuilt_without_warm_start(tmp_path_factory):
  """`make_default.build` run again, stopping before the warm start."""
  out = tmp_path_factory.mktemp("default")
  make_default.build(str(out), warm_start_steps=0)
  return out


def test_default_dir_is_reproducible(rebuilt_without_warm_start):
  """Tokenizer and config byte for byte; the weights come from the warm start below."""
  for name in ("config.json", "tokenizer.json"):
    assert (rebuilt_without_warm_start / name).read_text() == open(f"{models.DEFAULT_MODEL_DIR}/{name}").read()


def test_warm_start_data_carry_no_task_signal():
  """Every answer is a valid action drawn uniformly, whatever the observation."""
  tokenizer = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)
  episodes = warm_start.random_valid_episodes(tokenizer, warm_start.WARM_START_ENVS, 400, seed=0)
  actions = [turn["action"] for e in episodes for turn in e.transcript]
  assert all(turn["valid"] for e in episodes for turn in e.transcript)
  counts = collections.Counter(actions)
  assert sorted(counts) == ["Down", "Left", "Right", "Up"]
  expected = len(actions) / 4
  assert all(abs(c - expected) < 4 * expected**0.5 for c in counts.values())
  # the samples are the rollout loop's own: response tokens end with EOS
  sample = episodes[0].samples[0]
  response = [t for t, m in zip(sample.input_ids, sample.response_mask) if m]
  assert response[-1] == tokenizer.eos_token_id


def test_warm_start_frozenlake_conversations_show_the_board_after_each_move():
  """Multi-turn FrozenLake transcripts: one sample per episode, a board per turn."""
  tokenizer = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)
  entries = [e for e in warm_start.WARM_START_ENVS if e[0] == "FrozenLakeMultiTurn"]
  episodes = warm_start.random_valid_episodes(tokenizer, entries, 100, seed=0)
  longer = [e for e in episodes if e.num_turns > 1]
  assert longer, "random play on 4x4 maps should survive a first move now and then"
  for episode in longer:
    assert len(episode.samples) == 1
    text = tokenizer.decode(episode.samples[0].input_ids)
    assert text.count("<|im_start|>user") == episode.num_turns
    assert text.count("<answer>") == episode.num_turns


def test_shipped_default_is_format_warm_started(rebuilt_without_warm_start):
  """The shipped weights answer in format; the same model before the warm start does not."""
  assert warm_start.format_rate(models.DEFAULT_MODEL_DIR) >= 0.95
  assert warm_start.format_rate(str(rebuilt_without_warm_start), num_prompts=8) == 0.0


def test_frozenlake_compact_step_prompt_is_the_grid_alone():
  """system_prompt='none': no system message; a step sample's prompt is 27 tokens."""
  from rollx import config as rollx_config
  tokenizer = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)
  entry = rollx_config.env_entry("FrozenLake", max_tokens_per_step=8,
                                 **prompts.COMPACT_PROMPTS["FrozenLake"])
  env = envs.make_env("FrozenLake", {})
  obs, _ = env.reset(seed=5)
  ids = prompts.builder_for(entry, env, tokenizer).step_prompt(obs, 1, 10, (), 0)
  assert tokenizer.decode(ids) == f"<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n"
  assert len(ids) == 27


def test_frozenlake_config_step_prompt_is_the_grid_and_the_neighbour_line():
  """configs/frozenlake.py's samples: the grid, the line naming P's neighbours, nothing
  else (40 tokens), within the server's prefill bucket; the warm start reads the same."""
  from configs import frozenlake
  config = frozenlake.get_config()
  tokenizer = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)
  entry = config.custom_envs.FrozenLake
  env = envs.make_env("FrozenLake", entry.env_config.to_dict())
  obs, _ = env.reset(seed=5)
  grid, line = obs.rsplit("\n", 1)
  assert grid == envs.make_env("FrozenLake", {}).reset(seed=5)[0]
  assert line.split()[0::2] == ["Left", "Down", "Right", "Up"]
  ids = prompts.builder_for(entry, env, tokenizer).step_prompt(obs, 1, 10, (), 0)
  assert tokenizer.decode(ids) == f"<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n"
  assert len(ids) == 40 <= config.actor_infer.strategy_args.max_prefill_length
  assert len(ids) + entry.max_tokens_per_step <= config.actor_infer.strategy_args.max_cache_length
  # the warm start plays the env RL plays: the same resolved env config, defaults included
  warm = [e for e in warm_start.WARM_START_ENVS if e[0] == "FrozenLake"][0][1]
  assert (envs.make_env("FrozenLake", warm.env_config.to_dict()).config
          == envs.make_env("FrozenLake", entry.env_config.to_dict()).config)


def test_think_warm_start_reads_the_neighbours_and_still_answers_at_random(monkeypatch):
  """`think_tags`: each response opens with what lies next to P (perception of the
  board it answers), the answer stays uniform; an env without neighbours is named."""
  tokenizer = make_default.build_tokenizer(think=True)
  entries = [e for e in warm_start.WARM_START_ENVS if e[0] == "FrozenLake"]
  episodes = warm_start.random_valid_episodes(tokenizer, entries, 300, seed=0,
                                              think_tags=("FrozenLake",))
  actions = []
  for episode in episodes:
    for sample in episode.samples:
      text = tokenizer.decode(sample.input_ids)
      lines = text.split("user\n")[1].split("<|im_end|>")[0].splitlines()
      board = [line for line in lines if " " not in line]  # the grid, not the neighbour line
      r, c = next((r, row.index("P")) for r, row in enumerate(board) if "P" in row)
      cells = [board[r][c - 1] if c else "#", board[r + 1][c] if r + 1 < len(board) else "#",
               board[r][c + 1] if c + 1 < len(board[r]) else "#", board[r - 1][c] if r else "#"]
      assert f"<think>{''.join(cells)}</think><answer>" in text
      actions.append(text.split("<answer>")[1].split("</answer>")[0])
  counts = collections.Counter(actions)
  assert sorted(counts) == ["Down", "Left", "Right", "Up"]
  assert all(abs(n - len(actions) / 4) < 4 * (len(actions) / 4)**0.5 for n in counts.values())
  sokoban = [e for e in warm_start.WARM_START_ENVS if e[0] == "SimpleSokoban"]
  with monkeypatch.context() as m:
    m.delattr(envs.env_class("Sokoban"), "neighbours")
    with pytest.raises(ValueError, match="SimpleSokoban"):
      warm_start.random_valid_episodes(tokenizer, sokoban, 4, seed=0,
                                       think_tags=("SimpleSokoban",))


def test_the_default_recipe_warm_starts_sokoban_on_boards_with_the_line():
  """The shipped recipe (`WARM_START_ENVS`): SimpleSokoban's boards end with the
  neighbour line, as the Sokoban configs show it; `sokoban_neighbours=False` (the
  earlier recipe) differs in that entry alone."""
  plain, lined = warm_start.warm_start_envs(sokoban_neighbours=False), warm_start.WARM_START_ENVS
  assert [e[0] for e in plain] == [e[0] for e in lined]
  assert plain[:2] == lined[:2]
  tokenizer = make_default.build_tokenizer()
  for entries, has_line in ((plain, False), (lined, True)):
    (trajectory,) = warm_start.random_valid_episodes(tokenizer, entries[2:], 4, seed=0)
    text = tokenizer.decode(trajectory.samples[0].input_ids)
    assert ("\nLeft " in text) == has_line, text


def test_warm_start_steps_start_a_run_from_a_warm_started_copy(tmp_path, capsys):
  """`warm_start.prepare` (what rollx.train runs before its pipeline) builds the start
  once, reuses it while the recipe is the same and rebuilds it when it is not; play and
  eval only take a start built from their config's recipe."""
  import os
  from safetensors.numpy import load_file
  # FrozenLake's short rows keep the two steps cheap; WebShop's transcripts are below
  config = checks.validate(config_lib.load_file(os.path.join(ROOT, "configs", "frozenlake.py")))
  config.output_dir = str(tmp_path)
  config.warm_start_steps = 2
  looked = checks.validate(config_lib.load_file(os.path.join(ROOT, "configs", "frozenlake.py")))
  looked.output_dir, looked.warm_start_steps = str(tmp_path), 2
  warm_start.prepare(looked, build_missing=False)  # rollx.play / rollx.eval: nothing built yet
  assert looked.pretrain is None and os.listdir(tmp_path) == []
  warm_start.prepare(config)
  path = config.pretrain
  assert path == str(tmp_path / "warm_start") and os.listdir(tmp_path) == ["warm_start"]
  assert capsys.readouterr().out.splitlines()[-1].startswith(f"warm start: built {path} (2 steps")
  warm_start.prepare(looked, build_missing=False)
  assert looked.pretrain == path
  before = load_file(os.path.join(models.DEFAULT_MODEL_DIR, "model.safetensors"))
  after = load_file(os.path.join(path, "model.safetensors"))
  assert any(not np.array_equal(before[k], after[k]) for k in before)  # trained
  assert open(os.path.join(path, "tokenizer.json")).read() == open(
      os.path.join(models.DEFAULT_MODEL_DIR, "tokenizer.json")).read()
  stamp = os.path.getmtime(os.path.join(path, "model.safetensors"))
  config.pretrain = None
  warm_start.prepare(config)  # a resumed run reuses it
  assert config.pretrain == path and capsys.readouterr().out == f"warm start: reused {path}\n"
  assert os.path.getmtime(os.path.join(path, "model.safetensors")) == stamp
  config.pretrain, config.warm_start_steps = None, 1  # another recipe: built again
  warm_start.prepare(config)
  assert os.path.getmtime(os.path.join(path, "model.safetensors")) != stamp
  assert "built" in capsys.readouterr().out and os.listdir(tmp_path) == ["warm_start"]
  with pytest.raises(ValueError, match="exists and is not a warm start"):  # never a user's model
    warm_start.build(config, models.DEFAULT_MODEL_DIR)
  # the transcripts: WebShop pages, every answer valid on its page, the same step-wise cut
  shop = checks.validate(config_lib.load_file(os.path.join(ROOT, "configs", "webshop.py")))
  tokenizer = hf.load_tokenizer(models.resolve_model_dir(shop.pretrain))  # the shop's words
  entry = ("WebShop", shop.custom_envs.WebShop.to_dict(), dict(step_wise=True, history_length=0), 1.0)
  episodes = warm_start.random_valid_episodes(tokenizer, [entry], 20, seed=0,
                                              sequence_length=shop.sequence_length)
  turns = [turn for t in episodes for turn in t.transcript]
  assert len(turns) > 40 and all(turn["valid"] for turn in turns)
  assert {turn["action"].split("[")[0] for turn in turns} == {"search", "click"}
