#!/usr/bin/env python3
"""Writes a release's kustomization: the prod overlay with every service's image pinned by
digest (.github/workflows/release.yml runs it; docs/testing.md, "CI pipelines").

    release_images.py [--base ../prod] [--tag TAG] REF_FILE... > kustomization.yaml

Each REF_FILE holds one line `<service> <repository>@sha256:<64 hex digits>`, written by the
release workflow's job that pushed the service's image. Every service of services.toml must
have exactly one, and no other service may appear: a missing, repeated or unknown service,
or a reference that is not pinned by a sha256 digest, stops it (exit status 1). The result
overrides the images of --base (default `../prod`, i.e. it is meant for
k8s/overlays/release/kustomization.yaml): `sagaworks/<service>` becomes
`<repository>@sha256:...` in every container of the rendering, init containers included.

Needs python3 >= 3.11 (tomllib) and nothing else.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# services.toml's loader (scripts/lib/services_toml.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "lib"))
from services_toml import SERVICES_TOML, load_services  # noqa: E402

_REF = re.compile(r"([a-z][a-z0-9]*)\s+([a-z0-9][a-z0-9._/:-]*[a-z0-9])@(sha256:[0-9a-f]{64})")


def service_names(path: Path = SERVICES_TOML) -> list[str]:
    return list(load_services(path))


def pinned_images(lines: list[str], services: list[str]) -> dict[str, tuple[str, str]]:
    """service -> (repository, digest), from the reference lines; ValueError on any problem."""
    found: dict[str, tuple[str, str]] = {}
    for line in lines:
        m = _REF.fullmatch(line.strip())
        if not m:
            raise ValueError(f"not `<service> <repository>@sha256:<digest>`: {line.strip()!r}")
        name, repository, digest = m.groups()
        if name not in services:
            raise ValueError(f"{name}: not a service of services.toml")
        if name in found:
            raise ValueError(f"{name}: more than one image reference")
        found[name] = (repository, digest)
    missing = [name for name in services if name not in found]
    if missing:
        raise ValueError(f"no image reference for {', '.join(missing)}")
    return found


def kustomization(images: dict[str, tuple[str, str]], services: list[str], base: str, tag: str | None) -> str:
    out = [
        f"# {'The release ' + tag if tag else 'A release'}: the prod overlay with every service's image\n",
        "# pinned by digest, written by deploy/release_images.py (.github/workflows/release.yml).\n",
        "apiVersion: kustomize.config.k8s.io/v1beta1\n",
        "kind: Kustomization\n",
        "resources:\n",
        f"  - {base}\n",
        "images:\n",
    ]
    for name in services:
        repository, digest = images[name]
        out.append(f"  - name: sagaworks/{name}\n    newName: {repository}\n    digest: {digest}\n")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="../prod", help="the overlay the release pins (default ../prod)")
    parser.add_argument("--tag", help="the release's tag, for the header comment")
    parser.add_argument("--services", type=Path, default=SERVICES_TOML, help="services.toml")
    parser.add_argument("refs", nargs="+", type=Path, help="files of `<service> <repository>@sha256:<digest>` lines")
    args = parser.parse_args(argv)
    services = service_names(args.services)
    lines = [line for path in args.refs for line in path.read_text().splitlines() if line.strip()]
    try:
        images = pinned_images(lines, services)
    except ValueError as e:
        print(f"release_images.py: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(kustomization(images, services, args.base, args.tag))
    return 0


if __name__ == "__main__":
    sys.exit(main())
