"""How many tokens a round drafts (docs/design.md §6, §11): the cost model and its
calibration, what is learnt of acceptance, the schedules (FixedK, AdaptiveK), and k under
a batch's load. Built on the round; the generator and batches are built on it.
"""
