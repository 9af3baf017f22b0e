"""Model tests run many tiny matmuls."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls: with 2 OpenMP threads per xdist worker on 2 cores, thread barriers dominate."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

