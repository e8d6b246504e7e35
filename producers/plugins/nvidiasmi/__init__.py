"""NVIDIA GPUs read with nvidia-smi --query-gpu, as Telegraf does (see README.md)."""
