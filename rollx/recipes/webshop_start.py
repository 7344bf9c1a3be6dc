"""The shipped WebShop start: the tool model, warm started on WebShop random-play pages.

    python -m rollx.recipes.webshop_start    # ~32 min on 2 CPU cores

rebuilds `rollx/models/default_webshop/`, which configs/webshop.py starts RL from. A
WebShop action must copy words from the page: the instruction's words into
`search[...]`, a product id ("B00724", six single-character tokens of the default
tokenizer) into `click[...]`. The default model never learned to copy text; the tool
model (rollx/models/default_tools, rollx.recipes.tool_demos) did, in its copy
pretraining on random strings (its calculator demonstrations are arithmetic, nothing of
shopping). On it, the warm start of rollx.recipes.warm_start for configs/webshop.py's
env: random-valid-action transcripts of WebShop pages (no reward, no task signal: each
answer is a uniformly random valid action of its page), loss on the answers alone
(`warm_start_responses_only`): the pages are context. Measured 2026-11-28 (sampled,
temperature 1, 64 validation instructions x 4, on a first build of this recipe's data by
a trial run, not bit-identical to the build that ships): the earlier recipe (the default model,
loss on every token, 200 steps) clicked no product in 1,178 results-page actions and
never bought (invalid actions 0.50); this one makes 16% invalid actions and buys in 4%
of the episodes, with no success (a random purchase rarely matches the goal).

A run rebuilds the same start itself with
    --config.pretrain=rollx/models/default_tools --config.warm_start_steps=800
    --config.warm_start_responses_only=True
(in output_dir/warm_start; built once). Shipped so that a run, and a test, need not
spend the warm start's minutes.
"""

from __future__ import annotations

import os

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "configs", "webshop.py")
STEPS = 800  # 12,800 rows of 16: ~3,200 random episodes of <= 8 pages


def build(out_dir: str, config_path: str = CONFIG, steps: int = STEPS) -> str:
  """The tool model warm started for `config_path`'s WebShop env, written to `out_dir`."""
  from rollx import config as config_lib
  from rollx import models
  from rollx.recipes import warm_start
  config = config_lib.load_file(config_path)
  config.pretrain = models.DEFAULT_TOOLS_MODEL_DIR
  config.warm_start_steps = int(steps)
  config.warm_start_responses_only = True
  return warm_start.build_for_config(config, out_dir)


def main(argv):
  del argv
  from absl import flags
  f = flags.FLAGS
  print(f"wrote {build(f.out_dir, f.config, f.steps)}")


if __name__ == "__main__":
  from absl import app, flags
  from rollx.models import DEFAULT_WEBSHOP_MODEL_DIR
  flags.DEFINE_string("out_dir", DEFAULT_WEBSHOP_MODEL_DIR, "where to write the model")
  flags.DEFINE_string("config", CONFIG, "the WebShop config it is for")
  flags.DEFINE_integer("steps", STEPS, "warm-start steps on the random-play pages")
  app.run(main)
