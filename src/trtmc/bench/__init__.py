"""`trtmc bench`: trtmc against timm eager and torch.compile, same process, same device, same weights.

`spec` reads the entries (YAML), `timing` holds the protocol, `weights` resolves checkpoints (random
weights included) and timm's reference, `baselines` makes timm's competitors, `runner` times and
judges one entry, `report` writes results.json, results.md and latency.png, `cli` is the command.
Importing this package (and `cli`) loads neither torch, timm nor matplotlib; `trtmc --help`
stays fast.
"""
