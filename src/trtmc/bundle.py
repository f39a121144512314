"""Bundle v2: one file holding everything needed to classify with a model.

The file is a zip archive (stored, uncompressed) with these members:

    manifest.json        format version, tool version, family, architecture, task, num_classes,
                         source checkpoint (id, revision, sha256), precision, io_dtype, fp32_layers,
                         graph summary, engines (`backends.EngineEntry`: key, backend, device,
                         precision, files, batching, record), and the sha256 and size of every
                         other member
    runtime.json         the preprocessing contract (trtmc.preprocess.PreprocessSpec)
    labels.json          label names, descriptions ([] and {} when the checkpoint had none) and
                         vocabulary_id (trtmc.tasks.vocabulary_id; absent in older bundles)
    graph.json           the typed graph (precision assigned)
    weights.safetensors  the graph's weights (float32)
    engines/<key>/...    zero or more engines, keyed backend-device-precision

Version rule: a reader reads exactly its FORMAT_VERSION and refuses others, saying which it reads;
any change to what a member must hold bumps it. Version 2 added each engine entry's `batching`
(`{"max_batch": N}`: any batch 1..N, or `{"sizes": [...]}`: only those).

Writes are atomic: the archive is written to a temporary file beside the target and renamed
over it only once complete, so a failed build leaves no partial file. The reader refuses a
truncated archive, a member whose checksum or size does not match, an unknown format version, a
member that lacks a field or holds the wrong kind of value, and members that disagree with each
other (`bundle_schema`), each with one line naming the member, the field and the fix.

The manifest digest (`manifest_digest`: sha256 of manifest.json as stored) pins the whole bundle,
since the manifest pins every other member's sha256. `trtmc inspect` prints it; `read_bundle`
refuses a bundle whose digest differs from `expect_sha256` before checking or loading anything else.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from . import __version__
from .backends import EngineEntry
from .bundle_schema import MANIFEST, MemberError, engine_member, member_table, read_contents
from .files import write_atomically
from .graph import Graph
from .preprocess import PreprocessSpec

FORMAT_VERSION = 2
REBUILD = "rebuild it with `trtmc build`"



class BundleError(ValueError):
    """The bundle cannot be written or read; the message says what to do."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_digest(manifest_bytes: bytes) -> str:
    """The digest that pins a bundle: the sha256 (lower-case hex) of its manifest.json as stored."""
    return _sha256(manifest_bytes)


def expected_digest(text: str) -> str:
    """A digest a user typed (`--expect-sha256`), checked and in lower case."""
    digest = text.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError(f"--expect-sha256 takes the 64 hex digits `trtmc inspect` prints as the digest, got {text!r}")
    return digest


def weights_to_bytes(weights: dict[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return save({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()})


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


@dataclass(frozen=True)
class Bundle:
    """An opened bundle: every member verified and checked against the others."""

    path: Path
    manifest: Mapping[str, Any]  # manifest.json as stored
    members: Mapping[str, bytes]
    digest: str  # manifest_digest of manifest.json
    engines: tuple[EngineEntry, ...]
    preprocess: PreprocessSpec
    labels: Mapping[str, Any]  # {"names": [...], "descriptions": {...}}
    parsed_graph: Graph

    def graph(self) -> Graph:
        return self.parsed_graph

    def json(self, name: str) -> Any:
        return json.loads(self.members[name].decode("utf-8"))

    def engine_files(self, key: str) -> dict[str, bytes]:
        prefix = engine_member(key, "")
        return {name[len(prefix):]: data for name, data in self.members.items() if name.startswith(prefix)}


def _read_verified(path: Path, archive: zipfile.ZipFile, expect_sha256: str | None) -> tuple[bytes, dict[str, bytes]]:
    """manifest.json as stored, and every member it lists, each matching its recorded size and sha256."""
    names = archive.namelist()
    if MANIFEST not in names:
        raise BundleError(f"{path}: not a trtmc bundle (no {MANIFEST}); {REBUILD}")
    raw = archive.read(MANIFEST)
    if expect_sha256 is not None and manifest_digest(raw) != expect_sha256:
        raise BundleError(
            f"{path}: manifest digest {manifest_digest(raw)} is not the expected {expect_sha256}: this is not the "
            "bundle you pinned, so nothing in it was loaded; check where it came from, or pin the digest "
            "`trtmc inspect` prints for it"
        )
    manifest = json.loads(raw.decode("utf-8"))
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version != FORMAT_VERSION:
        raise BundleError(
            f"{path}: bundle format version {version!r} is not supported by trtmc {__version__} "
            f"(it reads version {FORMAT_VERSION}); {REBUILD} with this trtmc, or use the trtmc that wrote it"
        )
    members: dict[str, bytes] = {}
    for name, meta in member_table(manifest).items():
        if name not in names:
            raise BundleError(f"{path}: member {name} is missing; the file is damaged, {REBUILD}")
        data = archive.read(name)
        if len(data) != meta.size or _sha256(data) != meta.sha256:
            raise BundleError(f"{path}: member {name} fails its sha256 check (modified or corrupted); {REBUILD}")
        members[name] = data
    extra = set(names) - set(members) - {MANIFEST}
    if extra:
        raise BundleError(f"{path}: members {sorted(extra)} are not in the manifest (tampered); {REBUILD}")
    return raw, members


def read_bundle(path: Path, expect_sha256: str | None = None) -> Bundle:
    """Open and verify a bundle: its digest when one is expected, the format version, every member's
    size and sha256, then what each member holds and that they agree."""
    path = Path(path)
    expect = expected_digest(expect_sha256) if expect_sha256 is not None else None
    if not path.is_file():
        raise BundleError(f"{path}: no such bundle file")
    try:
        with zipfile.ZipFile(path) as archive:
            raw, members = _read_verified(path, archive, expect)
        manifest = json.loads(raw.decode("utf-8"))
        contents = read_contents(manifest, members)
    except MemberError as exc:
        raise BundleError(f"{path}: {exc.member}: {exc}; {REBUILD}") from exc
    except zipfile.BadZipFile as exc:
        raise BundleError(f"{path}: truncated, corrupted or not a trtmc bundle ({exc}); {REBUILD}") from exc
    except (zipfile.LargeZipFile, EOFError, OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{path}: damaged bundle ({type(exc).__name__}: {exc}); {REBUILD}") from exc
    return Bundle(
        path=path,
        manifest=manifest,
        members=members,
        digest=manifest_digest(raw),
        engines=contents.engines,
        preprocess=contents.preprocess,
        labels=contents.labels,
        parsed_graph=contents.graph,
    )
