import pytest
import torch

from seedfast.ops import tiles

# "one-tile": the default budget, every test problem fits one tile. "many-tiles": 2 KiB of logits per
# tile, i.e. blocks of 16 rows × 32 vocabulary entries (V is never a multiple of 32 in these tests).
TILE_CONFIGS = {"one-tile": None, "many-tiles": "2048"}


@pytest.fixture(params=list(TILE_CONFIGS))
def tile_config(request, monkeypatch):
    value = TILE_CONFIGS[request.param]
    if value is None:
        monkeypatch.delenv(tiles.TILE_BYTES_ENV, raising=False)
    else:
        monkeypatch.setenv(tiles.TILE_BYTES_ENV, value)
    return request.param


@pytest.fixture(autouse=True)
def one_thread():
    """These tests run many tiny matmuls; with 2 OpenMP threads per pytest-xdist worker on 2 cores,
    thread barriers dominate their time. Restored after each test."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
