import pytest

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
def _one_thread(one_torch_thread):
    """tests/conftest.py one_torch_thread, for every test here."""
