"""`trtmc study`: does a precision pay for a model? One command builds every variant from the same
checkpoint and measures them in one process; the report says whether to ship each quantized one.

- `request`: what a study runs (`StudyRequest`) and the images it uses (`ImageSplit`: calibration
  and held-out images never overlap);
- `quality`: top-1 agreement and KL divergence against timm fp32, top-1 against the labels in file
  names, and the non-finite scan over the held-out images and stress inputs;
- `decision`: the rule that ships a quantized precision, in code and in words;
- `runner`: building, loading, timing (the bench protocol: `bench.timing.time_interleaved`, the
  bench's clocks) and judging (`bench.oracle`) every variant; `results`: what it found;
- `report`: study.md, study.json and study.png in the shape of the founding FP8 studies.

Importing this package loads nothing: `trtmc.build` and `trtmc --help` stay light.
"""
