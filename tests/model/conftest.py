"""Model tests run many tiny matmuls."""

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """tests/conftest.py one_torch_thread, for every test here."""

