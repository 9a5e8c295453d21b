"""The static flavour (caches written in place by ScatterND, attention masked by position)
reproduces the Hugging Face models, on one case of each attention feature: GQA, windows +
soft-capping, ALiBi (bfloat16 and the model's dtype), learned positions, MLA, sinks, q/k
norms, MoE, partial rotary."""
from __future__ import annotations

import pytest

from parity_cases import assert_parity

STATIC_CASES = ["llama", "gemma2", "falcon_alibi", "bloom", "gpt2", "deepseek_v3", "gpt_oss",
                "qwen3", "mixtral", "phi", "cohere2"]


@pytest.mark.slow
@pytest.mark.parametrize("name", STATIC_CASES)
def test_static_flavour_parity_with_hugging_face(models, name):
    assert_parity(models, name, "static")
