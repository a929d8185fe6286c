"""A length predictor that stalls in its first ``predict``, for the predictor process's tests: the child runs it,
so a test can kill the child while a batch is in it. A module of its own: the child imports it to unpickle it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from tetriserve.common.length import LengthEstimate, PredictInput
from tetriserve.length_predictor.baseline import BucketQuantilePredictor


class StallsOnce(BucketQuantilePredictor):
    """The baseline predictor, but its first ``predict`` ever (across restarts: ``marker``, a file, says that one
    began) creates ``marker`` and then sleeps for a minute; every later one answers at once."""

    def __init__(self, marker: Path) -> None:
        super().__init__()
        self.marker = marker

    def predict(self, batch: Sequence[PredictInput]) -> list[LengthEstimate]:
        if not self.marker.exists():
            self.marker.touch()
            time.sleep(60)
        return super().predict(batch)
