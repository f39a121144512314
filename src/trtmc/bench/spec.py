"""What `trtmc bench` runs: the timing protocol, the baselines, the run's options, and one frozen
`Entry` per model, read from YAML.

The file has three top-level keys; `defaults` fills every field an entry leaves out, and relative
paths (`model:` folders, `photos:`) are resolved against the YAML file's own folder:

    protocol: {warmups: 3, iters: 10, margin: 0.05, round_ms: 20, host_round_ms: 100}
    defaults: {precision: fp16, batch: [1, 128], weights: checkpoint, photos: ../examples/images}
    entries:
      - model: timm/ghostnet_100.in1k          # HF id, local folder, or timm architecture name
      - name: lite0-real                       # optional; defaults to the model's short name
        model: ../examples/checkpoints/tf_efficientnet_lite0.in1k
        batch: [1, 8, 128]
        protocol: {iters: 20}                  # per-entry override of single protocol fields
        folder: {images: [2002, 20000]}        # the folder scope: files in, results out (see `FolderSpec`)

Every mistake is reported with the file, the entry (index and name) and the key at fault.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from ..precision import COMPUTE_PRECISIONS

PRECISIONS = COMPUTE_PRECISIONS
WEIGHTS = ("checkpoint", "random")
MAX_BATCH = 4096


@dataclass(frozen=True)
class BaselineSpec:
    """A baseline in words: its table column, its label (`{precision}` filled in) and what it runs."""

    header: str
    label_template: str
    description: str

    def label(self, precision: str) -> str:
        return self.label_template.format(precision=precision)


# timm's model as a user would run it (trtmc.bench.baselines makes them). `expert` is the headline: the
# fastest a user writes by hand without trtmc. max-autotune is opt-in: its compile takes minutes.
BASELINE_SPECS = {
    "expert": BaselineSpec(
        "expert",
        "expert {precision} CL",
        "timm in the entry's precision, channels_last, torch.compile (default mode), replayed in one manual "
        "torch.cuda.CUDAGraph per batch size from a static input buffer (on a CPU: the compiled model, called)",
    ),
    "eager-fp32": BaselineSpec("timm eager fp32", "timm eager fp32", "timm eager, fp32, contiguous input"),
    "eager-cl": BaselineSpec(
        "timm eager CL", "timm eager {precision} CL", "timm eager in the entry's precision, channels_last"
    ),
    "reduce-overhead": BaselineSpec(
        "compile reduce-overhead",
        "compile reduce-overhead {precision} CL",
        'torch.compile(mode="reduce-overhead") of the channels_last model in the entry\'s precision',
    ),
    "max-autotune": BaselineSpec(
        "compile max-autotune",
        "compile max-autotune {precision} CL",
        'torch.compile(mode="max-autotune") of the channels_last model in the entry\'s precision',
    ),
}
BASELINES = tuple(BASELINE_SPECS)
DEFAULT_BASELINES = ("expert", "eager-fp32", "eager-cl", "reduce-overhead")
HEADLINE = "expert"  # the headline ratio: this baseline's ms / trtmc's engine ms

TOP_KEYS = ("protocol", "defaults", "entries")
PROTOCOL_KEYS = ("warmups", "iters", "margin", "round_ms", "host_round_ms")
ENTRY_KEYS = ("name", "model", "precision", "batch", "weights", "photos", "seed", "protocol", "folder")
FOLDER_KEYS = ("images", "loader_workers", "baseline")
# How the folder scope's DataLoader baseline runs timm's model: as a user writes it (torch.compile in its
# default mode), or eager (no compile: a check of the harness where compiling takes minutes, a small CPU).
FOLDER_BASELINES = ("compile", "eager")
LOADER_WORKERS_CAP = 16  # the DataLoader's num_workers: the machine's cores, at most this many
MAX_FOLDER_IMAGES = 1_000_000
DEFAULT_KEYS = tuple(k for k in ENTRY_KEYS if k not in ("name", "model"))


class SpecError(ValueError):
    """A benchmark file or command line that cannot be run; the message names the place and the fix."""


@dataclass(frozen=True)
class TimingProtocol:
    """Per row: `warmups` untimed rounds, then `iters` timed ones; the median sample is the result.

    A round is back-to-back calls lasting at least `round_ms` (the warm-ups calibrate how many calls
    that takes); its sample is the round's time divided by its calls. `margin` is both the stability
    bound (a row whose samples stray further than this fraction from their median is re-run, up to
    `timing.MAX_ATTEMPTS` attempts in all, `timing.MAX_HOST_ATTEMPTS` on the host clock, then marked unstable)
    and the equivalence margin (a speed ratio within 1 +- margin counts as on par).

    Rows timed on the host clock (the task scope, whose Python and copies run on the host) follow the host's
    own speed, which on the lent GPU machine moves between ~0.45 and ~0.9 of its best from one 25 ms probe to
    the next, on all CPUs together, while rows timed on the GPU stay within 0.5% (benchmarks/NOTES.md, runs
    10-13). For them a round lasts at least `host_round_ms`: probes 25 ms apart are nearly independent
    (autocorrelation 0.17), so a 100 ms round averages about four of them (p10-p90 of the host's speed over
    100 ms windows 0.50-0.74, against 0.46-0.88 for single probes; run 13).
    """

    warmups: int = 3
    iters: int = 10
    margin: float = 0.05
    round_ms: float = 20.0
    host_round_ms: float = 100.0

    def validate(self, where: str) -> None:
        if not _is_int(self.warmups) or self.warmups < 1:
            raise SpecError(
                f"{where}: 'warmups' must be an integer >= 1 (they calibrate the calls per round), got {self.warmups!r}"
            )
        if not _is_int(self.iters) or self.iters < 3:
            raise SpecError(f"{where}: 'iters' must be an integer >= 3 (a median needs samples), got {self.iters!r}")
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) or not 0 < self.margin < 1:
            raise SpecError(f"{where}: 'margin' must be a fraction between 0 and 1 (0.05 is 5%), got {self.margin!r}")
        for key in ("round_ms", "host_round_ms"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise SpecError(f"{where}: {key!r} must be a positive number of milliseconds, got {value!r}")


@dataclass(frozen=True)
class FolderSpec:
    """The folder scope of an entry: for each count in `images`, a folder of that many files (the
    oracle's photos copied round-robin) classified end to end, files in, results out, by trtmc's
    pipeline and by the hand-written DataLoader baseline, each in a fresh process (`bench.folder`)."""

    images: tuple[int, ...]
    loader_workers: int | None = None  # the DataLoader's num_workers; None: the cores, at most LOADER_WORKERS_CAP
    baseline: str = "compile"  # one of FOLDER_BASELINES

    def validate(self, where: str) -> None:
        if not self.images or not all(_is_int(n) and 1 <= n <= MAX_FOLDER_IMAGES for n in self.images):
            raise SpecError(
                f"{where}: 'images' must be a list of image counts from 1 to {MAX_FOLDER_IMAGES}, such as "
                f"[2002, 20000], got {list(self.images)!r}"
            )
        if len(set(self.images)) != len(self.images):
            raise SpecError(f"{where}: 'images' lists a count twice: {list(self.images)!r}")
        if self.loader_workers is not None and (not _is_int(self.loader_workers) or self.loader_workers < 0):
            raise SpecError(
                f"{where}: 'loader_workers' must be an integer >= 0 (the DataLoader's num_workers; 0 loads in the "
                f"main process), got {self.loader_workers!r}"
            )
        if self.baseline not in FOLDER_BASELINES:
            raise SpecError(f"{where}: 'baseline' must be one of {', '.join(FOLDER_BASELINES)}, got {self.baseline!r}")


@dataclass(frozen=True)
class Entry:
    """One model to benchmark: built once, timed at every batch size, checked by the oracle."""

    name: str
    model: str  # Hugging Face id, local checkpoint folder, or timm architecture name (random weights)
    precision: str = "fp16"
    batch_sizes: tuple[int, ...] = (1, 128)
    weights: str = "checkpoint"  # or "random": a random-weight checkpoint written for the architecture
    photos: Path | None = None  # the oracle's folder of images; None: the photos shipped with trtmc
    seed: int = 0  # for random weights
    protocol: TimingProtocol = field(default_factory=TimingProtocol)
    folder: FolderSpec | None = None  # the folder scope; None: not run

    @property
    def max_batch(self) -> int:
        return max(self.batch_sizes)

    def validate(self, where: str) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise SpecError(f"{where}: 'model' must be a Hugging Face id, a checkpoint folder or a timm architecture name, got {self.model!r}")
        if not isinstance(self.name, str) or not self.name.strip():
            raise SpecError(f"{where}: 'name' must be a non-empty string, got {self.name!r}")
        if any(c in self.name for c in "/\\") or self.name != self.name.strip():
            raise SpecError(f"{where}: 'name' {self.name!r} names files: no slashes or surrounding spaces")
        if self.precision not in PRECISIONS:
            raise SpecError(f"{where}: 'precision' must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.weights not in WEIGHTS:
            raise SpecError(f"{where}: 'weights' must be 'checkpoint' or 'random', got {self.weights!r}")
        if not self.batch_sizes or not all(_is_int(b) and 1 <= b <= MAX_BATCH for b in self.batch_sizes):
            raise SpecError(f"{where}: 'batch' must be a list of integers from 1 to {MAX_BATCH}, got {list(self.batch_sizes)!r}")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise SpecError(f"{where}: 'batch' lists a size twice: {list(self.batch_sizes)!r}")
        if not _is_int(self.seed) or self.seed < 0:
            raise SpecError(f"{where}: 'seed' must be an integer >= 0, got {self.seed!r}")
        if self.photos is not None and not Path(self.photos).is_dir():
            raise SpecError(f"{where}: 'photos' {self.photos}: no such folder (the oracle's images)")
        self.protocol.validate(f"{where}: protocol")
        if self.folder is not None:
            self.folder.validate(f"{where}: folder")

    def with_random_weights(self) -> "Entry":
        """The entry as `--random-weights` benches it: timm's architecture with random weights, unless its model
        is a local folder (a checkpoint on disk is benched with its own weights)."""
        if Path(self.model).expanduser().is_dir():
            return self
        return replace(self, weights="random")


@dataclass(frozen=True)
class BenchOptions:
    """How a bench run goes, whatever its entries: where it writes, on which device, against what."""

    workdir: Path  # random-weight checkpoints and bundles go here
    device: str = "cuda"
    baselines: tuple[str, ...] = DEFAULT_BASELINES
    reuse_bundles: bool = False  # use bundles (and their recorded build times) from a prepare phase
    backend: str = "inductor"  # the trtmc engine benched (the reference engine times the harness itself)
    resume: bool = False  # take each entry an earlier run timed here (same entry, same environment) from its record

    def validate(self) -> None:
        from ..backends import BACKENDS

        if self.backend not in BACKENDS:
            raise SpecError(f"--backend {self.backend!r}: choose from {', '.join(BACKENDS)}")
        if self.device not in ("cpu", "cuda"):
            raise SpecError(f"--device {self.device!r}: choose cuda or cpu")
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise SpecError(
                    "--device cuda: PyTorch sees no CUDA GPU here; pass --device cpu to exercise the harness "
                    "(its times are then CPU times)"
                )
        for key in self.baselines:
            if key not in BASELINES:
                raise SpecError(f"--baseline {key!r}: choose from {', '.join(BASELINES)}")


@dataclass(frozen=True)
class BenchConfig:
    path: Path | None
    entries: tuple[Entry, ...]

    def select(self, names: list[str] | None) -> tuple[Entry, ...]:
        """The entries named (in the order given); an unknown name is an error listing the known ones."""
        if not names:
            return self.entries
        by_name = {e.name: e for e in self.entries}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            hint = _suggest(unknown[0], by_name)
            raise SpecError(
                f"--only {unknown[0]!r}: no such entry in {self.path}{hint}; entries: {', '.join(by_name)}"
            )
        return tuple(by_name[n] for n in dict.fromkeys(names))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _suggest(key: str, known) -> str:
    close = difflib.get_close_matches(str(key), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_keys(mapping: Mapping, allowed: tuple[str, ...], where: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise SpecError(f"{where}: unknown key {key!r}{_suggest(key, allowed)}; allowed: {', '.join(allowed)}")


def _mapping(value: Any, where: str) -> Mapping:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: must be a mapping of key: value, got {type(value).__name__}")
    return value


def _protocol(raw: Any, base: TimingProtocol, where: str) -> TimingProtocol:
    raw = _mapping(raw, where)
    _check_keys(raw, PROTOCOL_KEYS, where)
    protocol = replace(base, **dict(raw))
    protocol.validate(where)
    return protocol


def _batch(value: Any, where: str) -> tuple[int, ...]:
    if _is_int(value):
        value = [value]
    if not isinstance(value, list):
        raise SpecError(f"{where}: 'batch' must be a list of integers such as [1, 128], got {value!r}")
    return tuple(value)


def _folder(raw: Any, where: str) -> FolderSpec | None:
    if raw is None:
        return None
    raw = _mapping(raw, where)
    _check_keys(raw, FOLDER_KEYS, where)
    if "images" not in raw:
        raise SpecError(f"{where}: 'images' is required: the image counts of the folders, such as [2002, 20000]")
    images = raw["images"]
    if _is_int(images):
        images = [images]
    if not isinstance(images, list):
        raise SpecError(f"{where}: 'images' must be a list of image counts such as [2002, 20000], got {images!r}")
    return FolderSpec(tuple(images), raw.get("loader_workers"), raw.get("baseline", "compile"))


def default_name(model: str) -> str:
    """`timm/resnet50.a1_in1k` -> `resnet50`; `./x/tf_efficientnet_lite0.in1k` -> `tf_efficientnet_lite0`."""
    return Path(model.rstrip("/")).name.split(".")[0] or model


def _resolve(value: str, base: Path | None) -> str:
    path = Path(value).expanduser()
    if base is None or path.is_absolute():
        return str(path)
    return str((base / path).resolve())


def _is_local(model: str, base: Path | None) -> bool:
    return model.startswith((".", "/", "~")) or (base is not None and (base / model).exists())


def parse_config(raw: Any, path: Path | None = None) -> BenchConfig:
    """Validate a loaded YAML document into frozen entries (see the module docstring for the format)."""
    where = str(path) if path is not None else "<config>"
    base = path.parent if path is not None else None
    raw = _mapping(raw, where)
    _check_keys(raw, TOP_KEYS, where)
    protocol = _protocol(raw.get("protocol"), TimingProtocol(), f"{where}: protocol")
    defaults = _mapping(raw.get("defaults"), f"{where}: defaults")
    _check_keys(defaults, DEFAULT_KEYS, f"{where}: defaults")
    if "protocol" in defaults:
        protocol = _protocol(defaults["protocol"], protocol, f"{where}: defaults.protocol")
    items = raw.get("entries")
    if not isinstance(items, list) or not items:
        raise SpecError(f"{where}: 'entries' must be a non-empty list of models to benchmark")
    entries: list[Entry] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        label = f"{where}: entries[{index}]"
        item = _mapping(item, label)
        if "model" not in item:
            raise SpecError(f"{label}: 'model' is required (a Hugging Face id, a checkpoint folder or a timm architecture name)")
        model = item["model"]
        if isinstance(model, str):
            label = f"{where}: entries[{index}] ({item.get('name', default_name(model))})"
        _check_keys(item, ENTRY_KEYS, label)
        merged = {**{k: v for k, v in defaults.items() if k != "protocol"}, **item}
        if isinstance(model, str) and _is_local(model, base):
            model = _resolve(model, base)
        photos = merged.get("photos")
        if photos is not None and not isinstance(photos, str):
            raise SpecError(f"{label}: 'photos' must be the path of a folder of images, got {photos!r}")
        entry = Entry(
            name=merged.get("name", default_name(model) if isinstance(model, str) else ""),
            model=model,
            precision=merged.get("precision", "fp16"),
            batch_sizes=_batch(merged.get("batch", [1, 128]), label),
            weights=merged.get("weights", "checkpoint"),
            photos=Path(_resolve(photos, base)) if photos else None,
            seed=merged.get("seed", 0),
            protocol=_protocol(item.get("protocol"), protocol, f"{label}: protocol"),
            folder=_folder(merged.get("folder"), f"{label}: folder"),
        )
        entry.validate(label)
        if entry.name in seen:
            raise SpecError(
                f"{label}: name {entry.name!r} is already used by entries[{seen[entry.name]}]; give one of them a 'name:'"
            )
        seen[entry.name] = index
        entries.append(entry)
    return BenchConfig(path, tuple(entries))


def load_config(path: Path) -> BenchConfig:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such benchmark file; pass --config FILE, or --model MODEL to bench one model")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML ({exc})") from exc
    return parse_config(raw, path)
