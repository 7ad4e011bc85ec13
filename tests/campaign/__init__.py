"""The node-safety fault campaign (issue 12): random sequences of what happens to a GPU node,
with the contract's invariants checked after every step.

``python -m tests.campaign --steps N --seed S`` runs N steps and ends with the line
``N steps, 0 invariant violations`` (or the shrunk failing sequence and exit 1);
``tests/system/test_campaign.py`` runs a bounded one in ``.ci/run``.
"""
