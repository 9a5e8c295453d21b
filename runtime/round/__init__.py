"""One round of the loop (docs/design.md §4): sampling and the logits processors, the
acceptance rules (host and fused heads), lookup and the drafters, and the loop itself.
Built on the backends; the schedules (scheduler/) and the generator are built on it.
"""
