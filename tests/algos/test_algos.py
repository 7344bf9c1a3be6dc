"""Advantages, losses and KL control against hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rollx import config as config_lib
from rollx.algos import advantages as adv_lib, kl as kl_lib, losses

jax.config.update("jax_default_matmul_precision", "highest")


def cfg(**kw):
  c = config_lib.default_config()
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def numpy_gae(rewards, values, mask, gamma, lambd):
  """Reference: walk each row's response tokens backwards."""
  adv = np.zeros_like(rewards)
  for n in range(rewards.shape[0]):
    idx = np.flatnonzero(mask[n])
    next_v, next_a = 0.0, 0.0
    for t in idx[::-1]:
      delta = rewards[n, t] + gamma * next_v - values[n, t]
      next_a = delta + gamma * lambd * next_a
      next_v = values[n, t]
      adv[n, t] = next_a
  return adv, (adv + values) * mask


@pytest.mark.parametrize("gamma,lambd", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_numpy_reference_with_gaps_between_turns(gamma, lambd):
  rng = np.random.default_rng(0)
  mask = (rng.random((6, 40)) < 0.5).astype(np.float32)  # non-contiguous: turns + templates
  mask[3] = 0  # a row with no response at all
  rewards = rng.normal(size=(6, 40)).astype(np.float32) * mask
  values = rng.normal(size=(6, 40)).astype(np.float32)
  got_a, got_r = adv_lib.discounted_gae(jnp.asarray(rewards), jnp.asarray(values * mask),
                                        jnp.asarray(mask), gamma, lambd)
  want_a, want_r = numpy_gae(rewards, values * mask, mask, gamma, lambd)
  np.testing.assert_allclose(got_a, want_a, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_r, want_r, rtol=1e-5, atol=1e-5)


def test_grpo_group_normalisation_by_hand():
  mask = np.zeros((8, 5), np.float32)
  mask[:, 2:4] = 1
  inputs = {"response_mask": jnp.asarray(mask), "scores": jnp.array([1., 0, 0, 1, 1, 1, 1, 1]),
            "group_ids": jnp.array([0, 0, 0, 0, 1, 1, 1, 1]), "token_kl": jnp.zeros((8, 5))}
  adv, _ = adv_lib.compute_advantages(inputs, cfg(adv_estimator="grpo"))
  # group 0: mean 0.5, std 0.5 -> +-1; group 1: all equal -> no signal
  expected = np.array([1, -1, -1, 1, 0, 0, 0, 0]) * 0.5 / (0.5 + adv_lib.EPS)
  np.testing.assert_allclose(adv[:, 2], expected, rtol=1e-6)
  np.testing.assert_allclose(adv[:, 3], expected, rtol=1e-6)
  assert float(jnp.abs(adv[:, [0, 1, 4]]).max()) == 0.0


def test_episode_reward_gamma_scores_a_shorter_success_higher_by_hand():
  """Step-wise rows, shuffled: the episode score becomes sum_t gamma^t r_t from each
  episode's own first step; grpo then centres those within the group (method mean)."""
  # episode 0: success on its 3rd step; 1: an invalid answer (-0.01) at step 1, success
  # on its 4th; 2: into a hole on its 2nd step; 3: a success on its 2nd step that starts
  # at step_index 5 (t counts from the episode's first step)
  rows = [(0, 0, 0.), (0, 1, 0.), (0, 2, 1.), (1, 0, 0.), (1, 1, -.01), (1, 2, 0.), (1, 3, 1.),
          (2, 0, 0.), (2, 1, 0.), (3, 5, 0.), (3, 6, 1.)]
  order = np.random.default_rng(0).permutation(len(rows))
  rows = [rows[i] for i in order]
  episode_ids = np.array([e for e, _, _ in rows])
  step_index = np.array([s for _, s, _ in rows])
  rewards = np.array([r for _, _, r in rows], np.float32)
  want = {0: 0.81, 1: -0.009 + 0.729, 2: 0.0, 3: 0.9}
  got = adv_lib.discounted_episode_scores(rewards, episode_ids, step_index, 0.9)
  np.testing.assert_allclose(got, [want[e] for e in episode_ids], rtol=1e-6)
  np.testing.assert_allclose(adv_lib.discounted_episode_scores(rewards, episode_ids, step_index, 1.0),
                             [{0: 1., 1: .99, 2: 0., 3: 1.}[e] for e in episode_ids], rtol=1e-6)
  mask = np.zeros((len(rows), 4), np.float32)
  mask[:, 1:3] = 1
  inputs = {"response_mask": jnp.asarray(mask), "scores": jnp.asarray(rewards),
            "episode_scores": jnp.asarray([{0: 1., 1: .99, 2: 0., 3: 1.}[e] for e in episode_ids]),
            "group_ids": jnp.zeros(len(rows), jnp.int32), "episode_ids": jnp.asarray(episode_ids),
            "step_index": jnp.asarray(step_index), "token_kl": jnp.zeros((len(rows), 4))}
  config = cfg(adv_estimator="grpo", whiten_advantages=False, episode_reward_gamma=0.9)
  config.reward_normalization.method = "mean"
  adv, _ = adv_lib.compute_advantages(inputs, config)
  mean = sum(want.values()) / 4
  np.testing.assert_allclose(adv[:, 1], [want[e] - mean for e in episode_ids], rtol=1e-5)
  assert adv[episode_ids == 3, 1].min() > adv[episode_ids == 0, 1].max() > adv[episode_ids == 1, 1].max()
  config.episode_reward_gamma = 1.0  # the plain sum: the two clean successes alike
  adv, _ = adv_lib.compute_advantages(inputs, config)
  assert adv[episode_ids == 3, 1].min() == adv[episode_ids == 0, 1].max()


def test_reinforce_discounted_returns_and_last_token_score():
  mask = jnp.array([[0, 1, 1, 0, 1, 0]], jnp.float32)
  inputs = {"response_mask": mask, "scores": jnp.array([2.0]), "group_ids": jnp.array([0]),
            "token_kl": jnp.zeros((1, 6))}
  config = cfg(adv_estimator="reinforce", gamma=0.5)
  config.reward_normalization.method = "identity"
  adv, _ = adv_lib.compute_advantages(inputs, config)
  # score 2 on the last response token (t=4); response tokens t=1,2,4
  np.testing.assert_allclose(adv[0], [0, 0.5, 1.0, 0, 2.0, 0], rtol=1e-6)


def test_gigpo_anchor_groups_and_combined_advantage_by_hand():
  # One env group, two episodes on the same level.
  # episode 0: steps s0 (obs A, r=0), s1 (obs B, r=1)      score 1
  # episode 1: steps s0 (obs A, r=0), s1 (obs C, r=0), s2 (obs B, r=0)   score 0
  rows = [(0, 0, "A", 0.0), (0, 1, "B", 1.0), (1, 0, "A", 0.0), (1, 1, "C", 0.0), (1, 2, "B", 0.0)]
  anchors = {"A": 0, "B": 1, "C": 2}
  inputs = {
      "response_mask": jnp.ones((5, 3)), "token_kl": jnp.zeros((5, 3)),
      "scores": jnp.array([r for *_, r in rows]),
      "episode_scores": jnp.array([1.0, 1.0, 0.0, 0.0, 0.0]),
      "group_ids": jnp.zeros(5, jnp.int32),
      "episode_ids": jnp.array([e for e, *_ in rows]),
      "step_index": jnp.array([s for _, s, *_ in rows]),
      "anchor_ids": jnp.array([anchors[a] for *_, a, _ in rows]),
  }
  config = cfg(adv_estimator="gigpo", step_reward_gamma=0.5, gigpo_omega=1.0)
  config.reward_normalization.method = "mean"  # norm = 1: easy to do by hand
  adv, _ = adv_lib.compute_advantages(inputs, config)
  # step returns: ep0: s0 = 0 + 0.5*1 = 0.5, s1 = 1; ep1: all 0
  # anchor A: {0.5, 0} mean 0.25 -> +0.25, -0.25; B: {1, 0} mean .5 -> +.5, -.5; C: {0} -> 0
  # episode: scores {1, 0} mean 0.5 -> +0.5 for ep0 rows, -0.5 for ep1 rows
  expected = np.array([0.5 + 0.25, 0.5 + 0.5, -0.5 - 0.25, -0.5 + 0.0, -0.5 - 0.5])
  np.testing.assert_allclose(adv[:, 0], expected, rtol=1e-6)
  np.testing.assert_allclose(adv_lib.step_returns(inputs["scores"], inputs["episode_ids"],
                                                  inputs["step_index"], 0.5),
                             [0.5, 1.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("estimator", ["gae", "grpo", "reinforce"])
def test_step_wise_rows_get_the_advantages_of_their_trajectory(estimator):
  # Two groups of two episodes; each episode is one trajectory-wise row (responses of
  # all its turns, prompts between them) and the same tokens cut into one row per step,
  # rows shuffled. gae / grpo / reinforce must credit each response token the same.
  rng = np.random.default_rng(0)
  turns = [3, 1, 2, 4]  # env steps per episode
  scores = np.array([1.0, 0.0, 0.3, -0.2], np.float32)
  traj_mask, traj_values, traj_kl, step_rows = [], [], [], []
  for e, n in enumerate(turns):
    mask, values, kl = [], [], []
    for s in range(n):
      m = [0.0] * int(rng.integers(2, 5)) + [1.0] * int(rng.integers(1, 4))  # prompt, response
      v = list(rng.normal(size=len(m)).astype(np.float32))
      k = list(rng.normal(size=len(m)).astype(np.float32) * 0.1 * m)  # KL on responses only
      step_rows.append((e, s, m, v, k))
      mask, values, kl = mask + m, values + v, kl + k
    traj_mask.append(mask), traj_values.append(values), traj_kl.append(kl)

  def pad(rows, width=40):
    return jnp.asarray([r + [0.0] * (width - len(r)) for r in rows], jnp.float32)

  config = cfg(adv_estimator=estimator, gamma=0.9, lambd=0.8)
  traj = {"response_mask": pad(traj_mask), "values": pad(traj_values), "token_kl": pad(traj_kl),
          "scores": jnp.asarray(scores), "episode_scores": jnp.asarray(scores),
          "group_ids": jnp.array([0, 0, 1, 1]), "episode_ids": jnp.arange(4),
          "step_index": jnp.zeros(4, jnp.int32)}
  want_adv, want_ret = adv_lib.compute_advantages(traj, config)
  order = rng.permutation(len(step_rows))
  rows = [step_rows[i] for i in order]
  step = {"response_mask": pad([m for *_, m, v, k in rows]),
          "values": pad([v for *_, m, v, k in rows]), "token_kl": pad([k for *_, m, v, k in rows]),
          "scores": jnp.zeros(len(rows)),  # step rewards: not what these estimators use
          "episode_scores": jnp.asarray(scores[[e for e, *_ in rows]]),
          "group_ids": jnp.array([[5, 7][e // 2] for e, *_ in rows]),  # any ids
          "episode_ids": jnp.array([e for e, *_ in rows]),
          "step_index": jnp.array([s for _, s, *_ in rows])}
  got_adv, got_ret = adv_lib.compute_advantages(step, config)
  for name, got, want in (("advantages", got_adv, want_adv), ("returns", got_ret, want_ret)):
    for e in range(4):  # the episode's response tokens, step by step, in order
      want_e = np.asarray(want[e])[np.asarray(traj["response_mask"][e]) > 0]
      got_e = np.concatenate([np.asarray(got[i])[np.asarray(step["response_mask"][i]) > 0]
                              for s in range(turns[e]) for i in range(len(rows))
                              if rows[i][0] == e and rows[i][1] == s])
      np.testing.assert_allclose(got_e, want_e, rtol=1e-5, atol=1e-6, err_msg=name)
    pad_mask = np.asarray(step["response_mask"]) == 0
    assert np.all(np.asarray(got)[pad_mask] == 0), name


def test_whiten_and_clip():
  inputs = {"response_mask": jnp.ones((4, 2)), "scores": jnp.array([3., 0, 1, 2]),
            "group_ids": jnp.zeros(4, jnp.int32), "token_kl": jnp.zeros((4, 2))}
  config = cfg(adv_estimator="grpo", whiten_advantages=True, advantage_clip=1.0)
  adv, _ = adv_lib.compute_advantages(inputs, config)
  assert float(adv.max()) == 1.0 and float(adv.min()) == -1.0


def test_dropping_zero_advantage_samples_whitens_over_the_kept_ones():
  # group 0 (rows 0-3) learns something; group 1 (rows 4-7) scored alike: no signal
  mask = np.zeros((8, 3), np.float32)
  mask[:, :2] = 1
  mask[0, 1] = 0  # unequal lengths: plain whitening would shift the zero rows off zero
  inputs = {"response_mask": jnp.asarray(mask), "scores": jnp.array([1., 0, 0, 0, 1, 1, 1, 1]),
            "group_ids": jnp.array([0, 0, 0, 0, 1, 1, 1, 1]), "token_kl": jnp.zeros((8, 3))}
  config = cfg(adv_estimator="grpo", whiten_advantages=True)
  config.reward_normalization.method = "mean"
  plain, _ = adv_lib.compute_advantages(inputs, config)
  np.testing.assert_array_equal(plain[4:], 0.0)  # whitening leaves the zero rows at zero
  config.drop_zero_advantage_samples = True
  adv, _ = adv_lib.compute_advantages(inputs, config)
  np.testing.assert_array_equal(adv_lib.informative(adv), [True] * 4 + [False] * 4)
  np.testing.assert_array_equal(adv[4:], 0.0)
  np.testing.assert_array_equal(adv_lib.samples_to_train(adv_lib.informative(adv)), [0, 1, 2, 3])
  # dynamic sampling counts groups, not samples: group 0 only
  assert adv_lib.num_informative_groups(adv_lib.informative(adv), inputs["group_ids"]) == 1
  assert adv_lib.num_informative_groups(np.zeros(8, bool), inputs["group_ids"]) == 0
  # nothing to learn from anywhere: everything trains (KL loss), not an empty batch
  np.testing.assert_array_equal(adv_lib.samples_to_train(np.zeros(5, bool)), range(5))
  raw = np.array([0.75, -0.25, -0.25, -0.25])[:, None] * mask[:4]  # centred scores
  kept = mask[:4] > 0
  want = (raw - raw[kept].mean()) / (raw[kept].std() + adv_lib.EPS) * mask[:4]
  np.testing.assert_allclose(adv[:4], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("score", [9.4, -0.7, 1e6, 0.1 + 0.2])
@pytest.mark.parametrize("estimator", ["grpo", "reinforce", "gae"])
@pytest.mark.parametrize("method", ["mean_std", "mean"])
@pytest.mark.parametrize("whiten", [False, True])
def test_a_group_that_scored_alike_gets_exactly_zero(score, estimator, method, whiten):
  # group 0 learns something; group 1's 8 episodes all scored `score` (a float32 mean
  # of 8 x 9.4 is a rounding error away from 9.4)
  mask = np.zeros((12, 4), np.float32)
  mask[:, 1:3] = 1
  mask[5, 2] = 0  # unequal lengths: token-weighted whitening would shift zero rows
  scores = np.array([1., 0, 0, 1] + [score] * 8, np.float32)
  inputs = {"response_mask": jnp.asarray(mask), "scores": jnp.asarray(scores),
            "group_ids": jnp.array([0] * 4 + [1] * 8), "token_kl": jnp.zeros((12, 4)),
            "values": jnp.zeros((12, 4))}
  config = cfg(adv_estimator=estimator, whiten_advantages=whiten)
  config.reward_normalization.method = method
  adv, _ = adv_lib.compute_advantages(inputs, config)
  np.testing.assert_array_equal(adv[4:], 0.0)
  np.testing.assert_array_equal(adv_lib.informative(adv), [True] * 4 + [False] * 8)
  assert adv_lib.num_informative_groups(adv_lib.informative(adv), inputs["group_ids"]) == 1


@pytest.mark.parametrize("score", [9.4, -0.7, 1e6])
@pytest.mark.parametrize("method", ["mean_std", "mean"])
def test_gigpo_equal_episodes_and_anchor_groups_get_exactly_zero(score, method):
  # 8 episodes of one group, each two steps through the same two states (anchors),
  # with equal step rewards: every anchor group and the episode group scored alike
  n = 16
  inputs = {"response_mask": jnp.ones((n, 2)), "token_kl": jnp.zeros((n, 2)),
            "scores": jnp.full(n, score / 2, jnp.float32),
            "episode_scores": jnp.full(n, score, jnp.float32),
            "group_ids": jnp.zeros(n, jnp.int32),
            "episode_ids": jnp.repeat(jnp.arange(8), 2),
            "step_index": jnp.tile(jnp.arange(2), 8),
            "anchor_ids": jnp.tile(jnp.arange(2), 8)}
  config = cfg(adv_estimator="gigpo", whiten_advantages=True)
  config.reward_normalization.method = method
  adv, _ = adv_lib.compute_advantages(inputs, config)
  np.testing.assert_array_equal(adv, 0.0)
  assert not np.asarray(adv_lib.informative(adv)).any()


def grad_of_loss(ratio, advantage, dual=None):
  def f(logp):
    return losses.ppo_policy_loss(logp, jnp.zeros(1), jnp.array([advantage]), jnp.ones(1),
                                  0.2, 0.28, dual)[0]
  logp = jnp.log(jnp.array([ratio]))
  return float(f(logp)), float(jax.grad(f)(logp)[0])


@pytest.mark.parametrize("ratio,advantage,loss,grad", [
    (1.1, 2.0, -2.2, -2.2),  # inside the clip range: d(-A r)/dlogp = -A r
    (1.3, 2.0, -2.56, 0.0),  # above 1 + 0.28 with A > 0: clipped, no gradient
    (0.7, 2.0, -1.4, -1.4),  # below with A > 0: the unclipped side is taken
    (0.7, -2.0, 1.6, 0.0),  # below 1 - 0.2 with A < 0: clipped, no gradient
    (1.5, -2.0, 3.0, 3.0),  # above with A < 0: unclipped (pessimistic), gradient -A r
])
def test_ppo_loss_and_gradient_at_clip_boundaries(ratio, advantage, loss, grad):
  got_loss, got_grad = grad_of_loss(ratio, advantage)
  assert got_loss == pytest.approx(loss, rel=1e-5) and got_grad == pytest.approx(grad, abs=1e-5)


def test_dual_clip_caps_negative_advantage_loss():
  loss, grad = grad_of_loss(5.0, -2.0, dual=3.0)
  assert loss == pytest.approx(6.0) and grad == pytest.approx(0.0)
  loss, grad = grad_of_loss(2.0, -2.0, dual=3.0)
  assert loss == pytest.approx(4.0) and grad == pytest.approx(4.0)


def test_aggregation_modes():
  loss = jnp.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
  mask = jnp.array([[1, 1, 1], [1, 0, 0]])
  assert float(losses.aggregate(loss, mask, "token-mean")) == pytest.approx(10 / 4)
  assert float(losses.aggregate(loss, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
  assert float(losses.aggregate(loss, mask, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)


def test_value_loss_clip_and_kl_estimators():
  v, old, ret = jnp.array([1.0]), jnp.array([0.0]), jnp.array([2.0])
  # unclipped (1-2)^2 = 1; clipped v=0.5: (0.5-2)^2 = 2.25 -> max -> 0.5 * 2.25
  assert float(losses.value_loss(v, old, ret, jnp.ones(1), 0.5)) == pytest.approx(1.125)
  assert float(losses.value_loss(v, old, ret, jnp.ones(1), None)) == pytest.approx(0.5)
  logp, ref = jnp.log(jnp.array([0.5])), jnp.log(jnp.array([0.25]))
  assert float(losses.kl_divergence(logp, ref, "k1")[0]) == pytest.approx(np.log(2))
  assert float(losses.kl_divergence(logp, ref, "k3")[0]) == pytest.approx(0.5 - 1 + np.log(2))


def test_kl_loss_estimators_expected_gradients_by_enumeration():
  # One token position, a 4-way categorical: the expectation over a ~ pi of each
  # estimator's gradient (pi held fixed as the sampling distribution) against the exact
  # gradients on the logits: k2 -> grad KL(pi || ref) = pi * (log pi/ref - KL);
  # k3 -> grad KL(ref || pi) = pi - ref.
  z = jnp.array([1.0, -0.5, 0.3, 2.0])
  ref = jnp.array([0.25, 0.25, 0.25, 0.25])
  pi = jax.nn.softmax(z)

  def expected_grad(kind):
    def per_action(a):
      f = lambda logits: losses.kl_divergence(jax.nn.log_softmax(logits)[a], jnp.log(ref[a]),
                                              kind)
      return pi[a] * jax.grad(f)(z)
    return sum(per_action(a) for a in range(4))

  reverse_kl = float(jnp.sum(pi * jnp.log(pi / ref)))
  np.testing.assert_allclose(expected_grad("k2"), pi * (np.log(pi / ref) - reverse_kl),
                             rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(expected_grad("k3"), pi - ref, rtol=1e-5, atol=1e-7)
  # the per-token value by hand: r = pi / ref = 2 -> k2 = 0.5 log(2)^2
  logp, lref = jnp.log(jnp.array([0.5])), jnp.log(jnp.array([0.25]))
  assert float(losses.kl_divergence(logp, lref, "k2")[0]) == pytest.approx(0.5 * np.log(2) ** 2)
  with pytest.raises(ValueError, match="kl_loss_type 'mse'"):
    losses.kl_divergence(logp, lref, "mse")


def test_k3_is_capped_where_the_policy_made_a_sampled_token_unlikely():
  # pi = 1e-6 where pi_ref = 0.25: uncapped k3 ~ 2.5e5 with a gradient of the same size
  logp, ref = jnp.log(jnp.array([1e-6, 0.5])), jnp.log(jnp.array([0.25, 0.25]))
  k3 = losses.kl_divergence(logp, ref)
  assert float(k3[0]) == losses.K3_MAX
  assert float(k3[1]) == pytest.approx(0.5 - 1 + np.log(2), rel=1e-6)  # untouched below the cap
  grad = jax.grad(lambda lp: losses.kl_divergence(lp, ref).sum())(logp)
  assert float(grad[0]) == 0.0 and float(grad[1]) == pytest.approx(1 - 0.5, rel=1e-5)


def test_adaptive_kl_controller_by_hand():
  c = kl_lib.KLController(coef=0.1, target=1.0, horizon=100)
  assert c.update(2.0, 10) == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
  c = kl_lib.KLController(coef=0.1, target=1.0, horizon=100)
  assert c.update(0.5, 10) == pytest.approx(0.1 * (1 - 0.2 * 10 / 100))
  c = kl_lib.KLController(coef=0.1, target=1.0, horizon=100)
  assert c.update(1.1, 10) == pytest.approx(0.1 * (1 + 0.1 * 10 / 100))
  fixed = kl_lib.KLController(coef=0.3)
  assert fixed.update(5.0, 10) == 0.3


@pytest.mark.parametrize("estimator,grouping,method", [
    ("grpo", "batch", "mean_std"), ("grpo", "tags", "mean"), ("gae", "traj_group_id", "mean_std"),
    ("reinforce", "traj_group_id", "mean"), ("gigpo", "traj_group_id", "mean_std"),
    ("gigpo", "traj_group_id", "mean")])
def test_padding_rows_to_a_bucket_changes_no_advantage(estimator, grouping, method):
  # compute_advantages pads every batch (rows to a power of two) so that eager ops
  # compile once; padding rows must count in no group, episode, anchor or whitening.
  # Reference: the estimator on the unpadded step-wise rows, same view, no padding.
  rng = np.random.default_rng(3)
  steps = rng.integers(1, 5, 14)  # 14 episodes of 1-4 steps, in 3 groups, 2 tags
  n, t = int(steps.sum()), 6  # one row per step: not a power of two
  assert n & (n - 1)
  episode_ids = np.repeat(np.arange(14), steps)
  step_index = np.concatenate([np.arange(s) for s in steps])
  mask = np.zeros((n, t), np.float32)
  mask[:, 2:2 + 3] = 1
  mask[::4, 4] = 0  # unequal response lengths
  inputs = {"response_mask": mask, "scores": rng.normal(size=n).astype(np.float32),
            "episode_scores": rng.integers(0, 2, 14).astype(np.float32)[episode_ids],
            "group_ids": (episode_ids % 3).astype(np.int32), "tag_ids": (episode_ids % 2).astype(np.int32),
            "episode_ids": episode_ids.astype(np.int32), "step_index": step_index.astype(np.int32),
            "anchor_ids": rng.integers(0, 9, n).astype(np.int32),
            "token_kl": np.zeros((n, t), np.float32),
            "values": rng.normal(size=(n, t)).astype(np.float32)}
  config = cfg(adv_estimator=estimator, whiten_advantages=True)
  config.reward_normalization.grouping = grouping
  config.reward_normalization.method = method
  got_adv, got_ret = adv_lib.compute_advantages({k: jnp.asarray(v) for k, v in inputs.items()},
                                                config)
  assert got_adv.shape == (n, t)
  raw = {"gae": adv_lib.gae, "grpo": adv_lib.grpo, "reinforce": adv_lib.reinforce,
         "gigpo": adv_lib.gigpo}[estimator]
  if estimator != "gigpo":  # the same episode view, the estimator unpadded
    raw = adv_lib.on_episodes(raw, shape_stable=False)
  want_adv, want_ret = raw({k: jnp.asarray(v) for k, v in inputs.items()}, config)
  want_adv = np.asarray(want_adv) * mask
  want_adv = (want_adv - want_adv[mask > 0].mean()) / (want_adv[mask > 0].std() + adv_lib.EPS) * mask
  np.testing.assert_allclose(got_adv, want_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_ret, want_ret, rtol=1e-5, atol=1e-6)


def test_actor_loss_caps_a_negative_advantage_at_dual_clip_ratio(monkeypatch):
  # ratio 3 on a token with A = -1: clipped PPO gives 3, dual clip caps it at -A * c
  logp = jnp.log(jnp.array([[3.0]]))
  monkeypatch.setattr(losses.logprobs, "compute_logprobs", lambda *a: (logp, jnp.zeros((1, 1))))
  batch = {"input_ids": None, "segment_ids": None, "response_mask": jnp.ones((1, 1)),
           "old_logp": jnp.zeros((1, 1)), "advantages": jnp.array([[-1.0]])}
  for on, c, want in ((False, 2.0, 3.0), (True, 2.0, 2.0), (True, 2.5, 2.5)):
    config = cfg(dual_clip_loss=on, dual_clip_ratio=c)
    loss, _ = losses.actor_loss(config, None, None, batch, None)
    np.testing.assert_allclose(float(loss), want, rtol=1e-6)
