"""Names of the graph contract shared by exporter, runtime and tests.

See DESIGN.md, "The graph contract". The runtime owns these names; the
exporter imports them so that both sides always agree.
"""
from __future__ import annotations

INPUT_IDS = "input_ids"
POSITION_IDS = "position_ids"
LOGITS = "logits"


def past_key(i: int) -> str:
    return f"past_key.{i}"


def past_value(i: int) -> str:
    return f"past_value.{i}"


def new_key(i: int) -> str:
    return f"new_key.{i}"


def new_value(i: int) -> str:
    return f"new_value.{i}"


def input_names(num_layers: int) -> list[str]:
    names = [INPUT_IDS, POSITION_IDS]
    for i in range(num_layers):
        names += [past_key(i), past_value(i)]
    return names


def output_names(num_layers: int) -> list[str]:
    names = [LOGITS]
    for i in range(num_layers):
        names += [new_key(i), new_value(i)]
    return names
