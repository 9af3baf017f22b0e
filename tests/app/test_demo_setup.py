"""The demo's model line: a pretrained model is named by its folder, the tiny decoder by its shape."""

from pathlib import Path

from seedfast.app.demo import model_line
from seedfast.config import load_config


def test_the_model_line_names_a_pretrained_folder_or_the_tiny_decoder():
    assert model_line(load_config(None, ["model.path=.cache/models/smollm2-135m-instruct"]), 134_515_008) == (
        "smollm2-135m-instruct, 134.5M parameters, pretrained")
    tiny = model_line(load_config(Path(__file__).resolve().parents[2] / "configs" / "demo_cpu.yaml"), 600_000)
    assert tiny.startswith("Qwen3-style decoder, hidden 128, 2 layers, 0.60M parameters")
