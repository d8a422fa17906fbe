"""Put on PYTHONPATH by bench/real/run.py (`shims = ["torchcodec"]`): torchaudio.load decodes through
torchcodec (and FFmpeg), which the GPU machine lacks. This stand-in decodes what the synthetic data
holds, PCM WAV files, with the standard library, and hands torchaudio what torchcodec would: float32
samples in [-1, 1], channels first, and the sample rate."""

from . import decoders

__all__ = ["decoders"]
