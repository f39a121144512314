#!/usr/bin/env bash
# Builds .whl/ray-site.tar.xz: Ray 2.60 for the GPU machine's Python 3.12, as a site folder that
# `tools/gpu_session.sh ray` unpacks and puts on PYTHONPATH (nothing installs there from a registry).
#   bash tools/make_ray_site.sh      # here, where pip can download; then carry [".whl"] in the call
# Ray's wheel (79 MB) is over the 64 MiB a call carries: this keeps what Ray Data needs and drops its Java
# jars, RLlib, Serve, the LLM library and the dashboard's web client (~70 MB less), then
# compresses. Of Ray's requirements the GPU image lacks only jsonschema and its own (KINDS.md's package
# list); they are added. /.whl/ is git-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
pip=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}"
     -d "$work/wheels")
"${pip[@]}" ray==2.60.0 jsonschema referencing jsonschema-specifications rpds-py
mkdir -p "$work/site"
# Unpacked keeping each file's mode (`python3 -m zipfile -e` drops it, and Ray's gcs_server and raylet must stay
# executable: without that `ray.init` fails with PermissionError on the GPU machine).
python3 - "$work/site" "$work"/wheels/*.whl <<'PY'
import os, sys, zipfile
site, wheels = sys.argv[1], sys.argv[2:]
for wheel in wheels:
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            path = archive.extract(info, site)
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                os.chmod(path, mode)
PY
rm -rf "$work"/site/ray/{jars,rllib,serve,llm} "$work"/site/ray/dashboard/client/build
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p .whl
XZ_OPT=-9e tar -cJf .whl/ray-site.tar.xz -C "$work/site" .
ls -l .whl/ray-site.tar.xz
