"""torchcodec.decoders.AudioDecoder for PCM WAV files (see the package's docstring)."""

import wave
from types import SimpleNamespace

import numpy as np
import torch

_DTYPES = {1: np.uint8, 2: np.int16, 4: np.int32}


class AudioDecoder:
    def __init__(self, source, **kwargs):
        with wave.open(str(source), "rb") as audio:
            width, channels, rate = audio.getsampwidth(), audio.getnchannels(), audio.getframerate()
            frames = np.frombuffer(audio.readframes(audio.getnframes()), dtype=_DTYPES[width])
        samples = frames.reshape(-1, channels).T.astype(np.float32)
        if width == 1:
            samples = (samples - 128.0) / 128.0
        else:
            samples /= float(2 ** (8 * width - 1))
        self._data = torch.from_numpy(np.ascontiguousarray(samples))
        self.metadata = SimpleNamespace(sample_rate=rate, num_channels=channels, duration_seconds=self._data.shape[1] / rate)

    def get_all_samples(self):
        return SimpleNamespace(data=self._data, sample_rate=self.metadata.sample_rate, pts_seconds=0.0)

    def get_samples_played_in_range(self, start_seconds=0.0, stop_seconds=None):
        rate = self.metadata.sample_rate
        stop = None if stop_seconds is None else int(stop_seconds * rate)
        return SimpleNamespace(data=self._data[:, int(start_seconds * rate) : stop], sample_rate=rate, pts_seconds=start_seconds)
