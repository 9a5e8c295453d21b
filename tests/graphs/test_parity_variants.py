"""Config variants of dense families (RoPE scalings, tied heads, head sizes, norms and
residual layouts, q/k norms, clipping): exported graphs reproduce the Hugging Face models in
both flavours."""
from __future__ import annotations

import pytest

from parity_cases import DENSE_VARIANTS, assert_parity, flavours


@pytest.mark.slow
@pytest.mark.parametrize("name,graph", flavours(DENSE_VARIANTS))
def test_parity_with_hugging_face(models, name, graph):
    assert_parity(models, name, graph)
