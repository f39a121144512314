"""`trtmc bench`: trtmc against timm eager and torch.compile, same process, same device, same weights.

`spec` reads the entries (YAML) and names the baselines, `sources` resolves checkpoints (random
weights included), `baselines` makes timm's competitors, `timing` holds the protocol (clocks, rounds,
interleaving), `oracle` judges every row's answers against timm fp32, `runner` prepares, times and
judges one entry, `folder` runs an entry's folder scope (files in, results out, trtmc's pipeline
against a DataLoader), each side in a `folder_child` process, `results` holds what it found,
`report` writes results.json, results.md and latency.png, `cli` is the command. `timing` and
`oracle` serve any harness that times and judges callables, not only this command. Importing this
package (and `cli`) loads neither torch, timm nor matplotlib; `trtmc --help` stays fast.
"""
