"""The shipped tool-use start: the default model copy pretrained, then warm started on
solved calculator demonstrations of other task families.

    python -m rollx.recipes.tool_start    # ~30 min on 2 CPU cores

rebuilds `rollx/models/default_tools/`, which configs/tool_arithmetic.py and
configs/langgraph_arithmetic.py start RL from, in two stages (the data:
rollx.recipes.tool_demos; why each stage: docs/tool_arithmetic_recipe.md):
1. copy pretraining on `tool_demos.copy_episodes` in short rows;
2. the config's warm start (rollx.recipes.warm_start, loss on the model's turns) on
   `tool_demos.demonstration_episodes` in the config's tool loop, beside as many copy
   samples that open as that loop's episodes do.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from absl import app, flags

from rollx import config as config_lib
from rollx import models
from rollx.models import hf
from rollx.recipes import tool_demos, warm_start

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "configs", "tool_arithmetic.py")


def build_default_tools(out_dir: str, config_path: str = CONFIG, steps: int = 200,
                        copy_steps: int = 1600) -> str:
  """The default model, copy pretrained (`copy_steps`), then warm started for
  `config_path`'s tool loop (`steps`), written to `out_dir`."""
  config = config_lib.load_file(config_path)
  config.warm_start_steps = int(steps)
  with tempfile.TemporaryDirectory() as tmp:
    copied = os.path.join(tmp, "copy_pretrained")
    shutil.copytree(models.resolve_model_dir(None), copied)
    if copy_steps:
      tokenizer = hf.load_tokenizer(copied)
      # short samples (~40-130 tokens) packed into 512-token rows; small batches, many
      # steps: the copy skill appears after a plateau of a few hundred steps
      warm_start.warm_start(copied, steps=copy_steps, batch_size=8, learning_rate=3e-3,
                            episodes=tool_demos.copy_episodes(tokenizer, copy_steps * 24,
                                                              seed=config.seed),
                            responses_only=True, sequence_length=512,
                            log_every=max(1, copy_steps // 10))
    config.pretrain = copied
    return warm_start.build(config, out_dir, record=False)


def main(argv):
  del argv
  f = flags.FLAGS
  # --config is rollx.cli's (rollx.recipes.warm_start imports it): the path is what counts
  config_path = f["config"].config_filename if f["config"].present else CONFIG
  print(f"wrote {build_default_tools(f.out_dir, config_path, f.steps, f.copy_steps)}")


if __name__ == "__main__":
  # flags only when run as a script: importing this module must not claim flag names
  flags.DEFINE_string("out_dir", models.DEFAULT_TOOLS_MODEL_DIR, "where to write the model")
  flags.DEFINE_integer("steps", 200, "warm-start steps on the demonstrations")
  flags.DEFINE_integer("copy_steps", 1600, "copy-pretraining steps before them")
  app.run(main)
