#!/usr/bin/env python3
"""tests/tensorboard_scalars.py DIR — every scalar TensorBoard itself reads from DIR's event
files, one line "TAG<TAB>STEP<TAB>VALUE" each, as tests/test_tensorboard.c's --dump prints
them (tests/test_tensorboard.sh compares both with the log). Uses the `tensorboard` package's
EventAccumulator, the loader behind TensorBoard's scalar dashboard."""
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

accumulator = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})   # 0: keep every point
accumulator.Reload()
for tag in accumulator.Tags()["scalars"]:
    for event in accumulator.Scalars(tag):
        print("%s\t%d\t%.9g" % (tag, event.step, event.value))
