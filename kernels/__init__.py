"""Triton and Iris kernels, installed as ``autotaxer.kernels``; one module per op or building block."""
