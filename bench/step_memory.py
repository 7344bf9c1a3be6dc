"""XLA temp memory of a config's actor update and log-prob pass, before running it.

    python bench/step_memory.py --config=configs/sokoban.py:multiturn [--rows 64]
    python bench/step_memory.py --quick    # `make bench`: that config, 16 rows, 32 scored

Compiles (does not run) the actor's jitted update (loss, gradients over the
microbatches, the trust-region search) and the log-prob pass for one minibatch of
`--rows` packed rows of `sequence_length` tokens, with `--scored` response positions
per row, and prints each program's XLA temp buffer bytes (`memory_analysis()`: the
scratch it needs besides inputs and outputs) for three settings, the same process:
- dense: one softmax over each row (`attention_block=0`) and the whole minibatch at
  once (`per_device_train_batch_size` = rows, no accumulation);
- blocked: the config's `attention_block`, still the whole minibatch at once;
- as configured: the config's attention block and microbatches.
Ratios are against the dense setting (> 1: smaller); the last line: the configured
setting's.
"""

import os
import sys

from absl import app, flags
import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rollx import cli, models  # noqa: E402  (cli defines --config)
from rollx.trainer import learner as learner_lib  # noqa: E402
from rollx.parallel import mesh as mesh_lib  # noqa: E402

_ROWS = flags.DEFINE_integer("rows", 64, "packed rows per minibatch")
_SCORED = flags.DEFINE_integer("scored", 128, "response positions scored per row")
_QUICK = flags.DEFINE_bool("quick", False, "16 rows, 32 scored; without --config, "
                           "configs/sokoban.py:multiturn (make bench)")
QUICK_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "configs", "sokoban.py:multiturn")


def temp_mb(config, loaded, rows: int, scored: int):
  """(update MB, log-prob pass MB) of the actor as `config` sets it up."""
  w = config.actor_train
  mesh = mesh_lib.make_mesh(w.strategy_args, w.device_mapping, "actor_train")
  trainer = learner_lib.actor_trainer(config, loaded.config, mesh, 100)
  t = config.sequence_length
  spec = lambda n, shape, dtype: jax.ShapeDtypeStruct((n,) + shape, dtype)
  batch = dict(input_ids=spec(rows, (t,), jnp.int32), segment_ids=spec(rows, (t,), jnp.int32),
               score_index=spec(rows, (scored,), jnp.int32),
               response_mask=spec(rows, (t,), jnp.float32), old_logp=spec(rows, (t,), jnp.float32),
               ref_logp=spec(rows, (t,), jnp.float32), advantages=spec(rows, (t,), jnp.float32))
  update = trainer.update.lower(trainer.abstract_state, batch, jax.random.PRNGKey(0)).compile()
  micro = rows // trainer.grad_accum  # the pipeline's log-prob pass runs a microbatch
  inputs = {k: spec(micro, batch[k].shape[1:], batch[k].dtype)
            for k in ("input_ids", "segment_ids", "score_index")}
  logp = trainer.compute_logprobs.lower(trainer.abstract_state.params, inputs).compile()
  return tuple(p.memory_analysis().temp_size_in_bytes / 2**20 for p in (update, logp))


def main(argv):
  del argv
  rows, scored = _ROWS.value, _SCORED.value
  if _QUICK.value:
    rows, scored = 16, 32
    if cli.CONFIG.value is None:
      flags.FLAGS["config"].parse(QUICK_CONFIG)
  config = cli.load_config()
  loaded = models.load_model(config.pretrain)
  ma, ta = config.actor_train.model_args, config.actor_train.training_args
  print(f"{config.exp_name}: {rows} rows x "
        f"{config.sequence_length} tokens, {loaded.config.num_params / 1e6:.2f}M params, "
        f"{jax.devices()[0].platform}")
  configured = (ma.attention_block, ta.per_device_train_batch_size, ta.gradient_accumulation_steps)
  settings = [("dense", (0, rows, 1)), ("blocked", (ma.attention_block, rows, 1)),
              ("as configured", configured)]
  base = None
  for name, (block, per_device, accum) in settings:
    c = config.copy_and_resolve_references()
    c.actor_train.model_args.attention_block = block
    c.actor_train.training_args.per_device_train_batch_size = per_device
    c.actor_train.training_args.gradient_accumulation_steps = accum
    mb = temp_mb(c, loaded, rows, scored)
    base = base or mb
    print(f"{name:14} (block {block}, {per_device} rows x {accum}): update {mb[0]:8.0f} MB "
          f"({base[0] / mb[0]:5.2f}x)  log-probs ({rows // accum} rows) {mb[1]:7.0f} MB "
          f"({base[1] / mb[1]:5.2f}x)", flush=True)
  print(f"as configured vs dense: log-probs temp memory {base[1] / mb[1]:.2f}x, update temp "
        f"memory ratio {base[0] / mb[0]:.2f}x")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
