"""KL coefficient controllers (PPO paper): fixed, or adaptive towards `target_kl`."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class KLController:
  """coef <- coef * (1 + clip(KL / target - 1, -0.2, 0.2) * n / horizon) when adaptive."""
  coef: float
  target: float | None = None
  horizon: int = 10000

  def update(self, current_kl: float, n_steps: int) -> float:
    if self.target is not None:
      error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
      self.coef *= 1.0 + error * n_steps / self.horizon
    return self.coef

  def state_dict(self) -> dict:
    return dataclasses.asdict(self)


def from_config(config) -> KLController:
  return KLController(float(config.init_kl_coef), config.target_kl, int(config.kl_horizon))
