"""The shipped WebShop start: the tool model, with the shop's words in its vocabulary,
warm started on WebShop random-play pages.

    python -m rollx.recipes.webshop_start    # ~31-75 min on 2 CPU cores

rebuilds `rollx/models/default_webshop/`, which configs/webshop.py starts RL from. A
WebShop action must copy words from the page: the instruction's words into
`search[...]`, a product id ("B00724") into `click[...]`. The default model never learned
to copy text; the tool model (rollx/models/default_tools, rollx.recipes.tool_start) did,
in its copy pretraining on random strings of digits (its calculator demonstrations are
arithmetic, nothing of shopping). Two steps on it:
1. vocabulary (rollx.recipes.vocab): the frequent words of random-play pages, each with
   and without its leading space, become one token each, embedded as the mean of the
   pieces they replace plus noise of the embeddings' spread: a page is then ~2.2x fewer
   tokens and a search copies a few tokens where it copied dozens. Product ids keep
   their single-digit tokens, the digits the copy pretraining taught.
2. the warm start of rollx.recipes.warm_start for configs/webshop.py's env: random-
   valid-action transcripts of WebShop pages (no reward, no task signal: each answer is
   a uniformly random valid action of its page; a search is a span of the instruction,
   its length uniform from one word to all), loss on the answers alone
   (`warm_start_responses_only`): the pages are context.
`--shopper_steps=N` adds a third step (not in the shipped start): random-shopper
episodes (envs.webshop.shopper_response: every choice random, the goal never read).
What each step measured, and what was tried: docs/webshop_recipe.md.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from absl import app, flags
import numpy as np

import envs
from envs import webshop
from rollx import config as config_lib
from rollx import models
from rollx.models import hf
from rollx.recipes import vocab, warm_start

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "configs", "webshop.py")
STEPS = 800  # 12,800 rows of 16: ~3,200 random episodes of <= 8 pages
# The optional third stage (`--shopper_steps`, 0 in the shipped start)
SHOPPER_EPISODES = 600  # random-shopper episodes of <= 6 pages (search, product, options, buy)
SHOPPER_LEARNING_RATE = 1e-3  # half the first stage's: a short second pass
VOCAB_EPISODES = 300  # random-play episodes whose pages the new words are counted on
MAX_WORDS = 1200  # more than the synthetic shop's pages have (1,064 forms seen >= 5 times)


def page_texts(config, episodes: int = VOCAB_EPISODES, seed: int = 0):
  """What the policy reads and writes in random play of `config`'s training WebShop env:
  the env's instructions, every page, every answer (the training split only)."""
  entry = config.custom_envs[config.train_env_manager.tags[0]]
  env = envs.make_env(entry.env_type, entry.env_config.to_dict())
  rng = np.random.default_rng(seed)
  for i in range(episodes):
    obs, _ = env.reset(seed=seed + i)
    yield env.instructions
    yield obs
    while True:
      answer = env.sample_valid_response(rng)
      obs, _, terminated, truncated, _ = env.step(answer)
      yield answer
      yield obs
      if terminated or truncated:
        break


def build(out_dir: str, config_path: str = CONFIG, steps: int = STEPS,
          max_words: int = MAX_WORDS, shopper_steps: int = 0) -> str:
  """The tool model, its vocabulary extended with the shop's words, warm started for
  `config_path`'s WebShop env on random play (then, with `shopper_steps`, on random-shopper
  play: `shop`), written to `out_dir`."""
  config = config_lib.load_file(config_path)
  config.warm_start_steps = int(steps)
  config.warm_start_responses_only = True
  with tempfile.TemporaryDirectory() as tmp:
    extended = os.path.join(tmp, "tools_shop_words")
    shutil.copytree(models.DEFAULT_TOOLS_MODEL_DIR, extended)
    if max_words:
      print(f"vocabulary: {vocab.extend_vocabulary(extended, page_texts(config), max_words)}")
    config.pretrain = extended
    built = warm_start.build(config, out_dir, record=False)
  if shopper_steps:
    shop(built, config, shopper_steps)
  return built


def shop(model_dir: str, config, steps: int) -> dict:
  """Stage 3, in place: `steps` on SHOPPER_EPISODES random-shopper transcripts of
  `config`'s training WebShop env (envs.webshop.shopper_response: the shop's procedure,
  every choice random, no goal read), loss on the answers alone."""
  entries = warm_start.train_entries(config)
  transcripts = warm_start.random_valid_episodes(
      hf.load_tokenizer(model_dir), entries, SHOPPER_EPISODES, seed=0,
      sequence_length=config.sequence_length, policy=webshop.shopper_response)
  return warm_start.warm_start(model_dir, steps=steps, episodes=transcripts,
                               sequence_length=config.sequence_length, log_every=25,
                               responses_only=tuple(tag for tag, *_ in entries),
                               learning_rate=SHOPPER_LEARNING_RATE)


def main(argv):
  del argv
  f = flags.FLAGS
  # --config is rollx.cli's (rollx.recipes.warm_start imports it): the path is what counts
  config_path = f["config"].config_filename if f["config"].present else CONFIG
  print(f"wrote {build(f.out_dir, config_path, f.steps, f.max_words, f.shopper_steps)}")


if __name__ == "__main__":
  # flags only when run as a script: importing this module must not claim flag names
  flags.DEFINE_string("out_dir", models.DEFAULT_WEBSHOP_MODEL_DIR, "where to write the model")
  flags.DEFINE_integer("steps", STEPS, "warm-start steps on the random-play pages")
  flags.DEFINE_integer("max_words", MAX_WORDS, "shop words the tokenizer learns (0: none)")
  flags.DEFINE_integer("shopper_steps", 0, "steps on random-shopper transcripts after the "
                       "random play (0: the shipped start; docs/webshop_recipe.md)")
  app.run(main)
