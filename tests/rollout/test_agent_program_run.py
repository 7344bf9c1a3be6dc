"""An agent program trained as a user runs it: `python -m rollx.train
--config=configs/langgraph_arithmetic.py` for one step (examples/langgraph_agent.py, a
LangGraph ReAct graph over langchain-openai, in Ray env workers, its model calls through
each worker's OpenAI-compatible endpoint and recorded token-exactly for the trainer)."""

from tests.rollout.test_tool_loop import train_arithmetic
from tests.test_pipeline import tb_scalars


def test_one_training_step_of_the_shipped_langgraph_config(tmp_path):
  out = tmp_path / "run"
  result = train_arithmetic("langgraph_arithmetic", 1, out)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "step 1/1" in result.stdout, result.stdout[-3000:]
  scalars = tb_scalars(out / "logs" / "langgraph_arithmetic_grpo")
  # the step trained on the programs' recorded calls, and validation scored the
  # programs' replies by the env
  episodes = next(v for k, v in scalars.items() if k.endswith("Arithmetic/num_episodes"))
  assert sum(episodes.values()) >= 8, episodes
  assert any(k.endswith("actor/loss") for k in scalars), sorted(scalars)
  assert any("ArithmeticVal/success" in k for k in scalars), sorted(scalars)
