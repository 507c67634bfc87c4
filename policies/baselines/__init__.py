"""Baseline step-k policies, driven like draftctl goodput: one k per engine step.

Every module here decides the verify width of one step of a padded batch (every row verifies
the step's widest k) through the ``StepPolicy`` protocol of ``base.py``:

- ``fixed``: no speculation, and static k;
- ``schedule``: vLLM's ``num_speculative_tokens_per_batch_size`` (k from the batch size only),
  as ``draftctl policy export-schedule`` computes it;
- ``vllm_av``: vLLM's adaptive verification (survival-scored draft slots under a budget from
  the profiled cost), with its estimators in ``logistic_acceptance`` (draft-logit confidence)
  and ``survival_ema`` (acceptance EMA), its budget in ``slot_budget`` and the cost that
  budget prices in ``ragged_cost``;
- ``oracle``: a clairvoyant per-step choice, and a bound that holds for every policy.

What each reproduces, and from which source: docs/baselines.md. Pure: no I/O, no clock, no
torch; randomness, when a policy needs any, is passed in.
"""
