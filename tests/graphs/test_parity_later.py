"""Later dense families and the legacy ones: exported graphs reproduce the Hugging Face
models in both flavours (ALiBi models in the standard flavour only)."""
from __future__ import annotations

import pytest

from parity_cases import LATER, assert_parity, flavours


@pytest.mark.slow
@pytest.mark.parametrize("name,graph", flavours(LATER))
def test_parity_with_hugging_face(models, name, graph):
    assert_parity(models, name, graph)
