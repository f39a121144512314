"""Bundle v1: one file holding everything needed to classify with a model.

The file is a zip archive (stored, uncompressed) with these members:

    manifest.json        format version, tool version, family, architecture, task, source
                         checkpoint (id, revision, sha256), precision, engines, and the sha256 and
                         size of every other member
    runtime.json         the preprocessing contract (trtmc.preprocess.PreprocessSpec)
    labels.json          label names, descriptions ([] and {} when the checkpoint had none) and
                         vocabulary_id (trtmc.tasks.vocabulary_id; absent in older bundles)
    graph.json           the typed graph (precision assigned)
    weights.safetensors  the graph's weights (float32)
    engines/<key>/...    zero or more engines, keyed backend-device-precision

Writes are atomic: the archive is written to a temporary file beside the target and renamed
over it only once complete, so a failed build leaves no partial file. The reader refuses a
truncated archive, a member whose checksum or size does not match, and an unknown format
version, each with an error that says what to do.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .files import write_atomically
from .graph import Graph
from .preprocess import PreprocessSpec

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class BundleError(ValueError):
    """The bundle cannot be written or read; the message says what to do."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def engine_member(key: str, filename: str) -> str:
    return f"engines/{key}/{filename}"


def weights_to_bytes(weights: dict[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return save({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()})


def weights_from_bytes(data: bytes) -> dict[str, np.ndarray]:
    from safetensors.numpy import load

    return load(data)


def write_bundle(path: Path, manifest: dict[str, Any], members: dict[str, bytes]) -> Path:
    """Write members plus a manifest that checksums them, atomically, to `path`."""
    path = Path(path)
    if not path.parent.is_dir():
        raise BundleError(f"cannot write {path}: folder {path.parent} does not exist")
    manifest = dict(manifest)
    manifest["format_version"] = FORMAT_VERSION
    manifest["tool_version"] = __version__
    manifest["members"] = {name: {"sha256": _sha256(data), "size": len(data)} for name, data in sorted(members.items())}

    def write(f) -> None:
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as archive:
            archive.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
            for name, data in sorted(members.items()):
                archive.writestr(name, data)

    write_atomically(path, write)
    return path


@dataclass
class Bundle:
    path: Path
    manifest: dict[str, Any]
    members: dict[str, bytes]

    @property
    def preprocess(self) -> PreprocessSpec:
        return PreprocessSpec.from_json(self.json("runtime.json"))

    @property
    def labels(self) -> dict[str, Any]:
        return self.json("labels.json")

    @property
    def engines(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("engines", []))

    def json(self, name: str) -> Any:
        return json.loads(self.members[name].decode("utf-8"))

    def graph(self) -> Graph:
        return Graph.from_json(self.json("graph.json"), weights_from_bytes(self.members["weights.safetensors"]))

    def engine_files(self, key: str) -> dict[str, bytes]:
        prefix = engine_member(key, "")
        return {name[len(prefix):]: data for name, data in self.members.items() if name.startswith(prefix)}


def read_bundle(path: Path) -> Bundle:
    """Open and verify a bundle: format version first, then every member's size and sha256."""
    path = Path(path)
    rebuild = "rebuild it with `trtmc build`"
    if not path.is_file():
        raise BundleError(f"{path}: no such bundle file")
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if MANIFEST not in names:
                raise BundleError(f"{path}: not a trtmc bundle (no {MANIFEST}); {rebuild}")
            manifest = json.loads(archive.read(MANIFEST).decode("utf-8"))
            version = manifest.get("format_version") if isinstance(manifest, dict) else None
            if version != FORMAT_VERSION:
                raise BundleError(
                    f"{path}: bundle format version {version!r} is not supported by trtmc {__version__} "
                    f"(it reads version {FORMAT_VERSION}); {rebuild} with this trtmc, or use the trtmc that wrote it"
                )
            expected = manifest.get("members", {})
            members: dict[str, bytes] = {}
            for name, meta in expected.items():
                if name not in names:
                    raise BundleError(f"{path}: member {name} is missing; the file is damaged, {rebuild}")
                data = archive.read(name)
                if len(data) != meta["size"] or _sha256(data) != meta["sha256"]:
                    raise BundleError(
                        f"{path}: member {name} fails its sha256 check (modified or corrupted); {rebuild}"
                    )
                members[name] = data
            extra = set(names) - set(expected) - {MANIFEST}
            if extra:
                raise BundleError(f"{path}: members {sorted(extra)} are not in the manifest (tampered); {rebuild}")
    except zipfile.BadZipFile as exc:
        raise BundleError(f"{path}: truncated, corrupted or not a trtmc bundle ({exc}); {rebuild}") from exc
    except (zipfile.LargeZipFile, EOFError, OSError, KeyError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{path}: damaged bundle ({type(exc).__name__}: {exc}); {rebuild}") from exc
    return Bundle(path=path, manifest=manifest, members=members)
