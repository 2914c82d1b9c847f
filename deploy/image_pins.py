#!/usr/bin/env python3
"""Lists every reference to a registry image in the repository that is not pinned by digest
(`<image>:<tag>@sha256:<64 hex>`): a tag alone can be moved to other content by whoever
controls the registry's repository.

Usage (scripts/validate-deploy runs it in the reporting mode):

    image_pins.py            # prints each unpinned reference with its file and line; exit 0
    image_pins.py --strict   # the same, and exit 1 when there is one

Where it looks: docker-compose.yml; every Dockerfile under deploy/ (the defaults of its
`ARG <NAME>_IMAGE=` lines and its `FROM` lines that name an image); the `image:` and
`container:` values of the YAML files under k8s/, deploy/ and .github/workflows/ (a
kustomization's `images:` entries rename or retag references that are counted where they
are written; the overlays' only renames are to local images).

Not registry images, so left out: this project's own images (`sagaworks/<service>`, built
from deploy/Dockerfile, pinned by digest in a release by deploy/release_images.py; the
`sagaworks-local/` and `sagaworks.local/` images that scripts/images and scripts/k8s build on
the machine), values holding a variable (`${...}`), and template placeholders.

Needs python3. docs/security.md ("Open") lists what is still unpinned, and why.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


ROOT = Path(__file__).resolve().parent.parent
#: Images built by this project, never pulled from a registry by these names.
OWN_PREFIXES = ("sagaworks/", "sagaworks-local/", "sagaworks.local/")
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_ARG_IMAGE = re.compile(r"^\s*ARG\s+(\w*IMAGE)=(\S+)\s*$")
_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?\s*$", re.IGNORECASE)
_YAML_IMAGE = re.compile(r"^\s*(?:-\s+)?(image|container):\s*[\"']?([^\"'\s#]+)[\"']?\s*(?:#.*)?$")


@dataclass(frozen=True)
class ImageRef:
    path: str  # relative to the repository root
    line: int
    ref: str

    @property
    def pinned(self) -> bool:
        return bool(DIGEST.search(self.ref))

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.ref}"


def is_registry_image(ref: str) -> bool:
    return not ("$" in ref or "{{" in ref or ref.startswith(OWN_PREFIXES))


def dockerfile_refs(text: str) -> Iterator[tuple[int, str]]:
    stages: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        if m := _ARG_IMAGE.match(line):
            yield number, m.group(2)
        elif m := _FROM.match(line):
            image, stage = m.group(1), m.group(2)
            if image.lower() not in stages and image != "scratch":
                yield number, image
            if stage:
                stages.add(stage.lower())


def yaml_refs(text: str) -> Iterator[tuple[int, str]]:
    """`image:` values, and `container:` ones (a workflow job's image, written as a string),
    with their lines."""
    for number, line in enumerate(text.splitlines(), 1):
        if m := _YAML_IMAGE.match(line):
            yield number, m.group(2)


def files(root: Path) -> Iterator[Path]:
    yield root / "docker-compose.yml"
    for pattern, base in (("**/Dockerfile", "deploy"), ("**/*.yaml", "k8s"), ("**/*.yml", "k8s"),
                          ("**/*.yaml", "deploy"), ("**/*.yml", "deploy"), ("*.yml", ".github/workflows")):
        yield from sorted((root / base).glob(pattern))


def image_refs(root: Path = ROOT) -> list[ImageRef]:
    """Every reference to a registry image in the files image_pins.py looks at."""
    found: list[ImageRef] = []
    for path in files(root):
        if not path.is_file():
            continue
        text = path.read_text()
        rel = str(path.relative_to(root))
        if path.name == "Dockerfile":
            refs = list(dockerfile_refs(text))
        else:
            refs = list(yaml_refs(text))
        found += [ImageRef(rel, number, ref) for number, ref in refs if is_registry_image(ref)]
    return found


def unpinned(root: Path = ROOT) -> list[ImageRef]:
    return [ref for ref in image_refs(root) if not ref.pinned]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 when a reference is not pinned by digest")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    refs = image_refs(args.root)
    missing = [ref for ref in refs if not ref.pinned]
    for ref in missing:
        print(f"UNPINNED {ref}")
    distinct = sorted({ref.ref for ref in missing})
    print(f"image_pins: {len(refs)} registry image references, {len(refs) - len(missing)} pinned by digest, "
          f"{len(missing)} not ({len(distinct)} distinct: {', '.join(distinct) or 'none'})")
    return 1 if args.strict and missing else 0


if __name__ == "__main__":
    sys.exit(main())
