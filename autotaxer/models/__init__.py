"""Model layers served by autotaxer, for examples and the layer benchmark (``bench/layer.py``)."""

from .llama import COMMS, LlamaConfig, LlamaLayer, TPLlamaLayer, layer_problems

__all__ = ["COMMS", "LlamaConfig", "LlamaLayer", "TPLlamaLayer", "layer_problems"]
