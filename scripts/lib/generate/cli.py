#!/usr/bin/env python3
"""scripts/generate: the per-service deployment pieces, from services.toml and the
templates under deploy/template/deployment/.

    scripts/generate           write every generated file and region
    scripts/generate --check   write nothing; fail naming each file that differs (with a diff)

Generated are: whole files (targets.SERVICE_FILES, for each service of services.toml, with a
header naming their template), and the regions between `BEGIN generated` and `END
generated` lines in the hand-written files of targets.REGION_FILES (engine.py). A generated
file that no entry of services.toml accounts for any more is deleted.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from services_toml import load_services  # noqa: E402

from generate import targets  # noqa: E402
from generate.context import global_context, service_context  # noqa: E402
from generate.engine import GenerateError, Region, fill_regions, render  # noqa: E402


def _template(root: Path, rel: str) -> str:
    path = root / targets.TEMPLATES / rel
    if not path.is_file():
        raise GenerateError(f"no template {targets.TEMPLATES}/{rel}")
    return path.read_text()


def expected(root: Path) -> tuple[dict[str, str], set[str]]:
    """({path: content} of every generated file and every file with regions, the paths of
    generated files to delete)."""
    try:
        services = load_services(root / "services.toml")
    except ValueError as e:
        raise GenerateError(str(e)) from None
    out: dict[str, str] = {}
    for f in targets.whole_files(services):
        body = render(_template(root, f.template), service_context(f.service, services), f.template)
        out[f.path] = targets.header(f.path, f.template) + body

    def region(r: Region) -> str:
        text = _template(root, r.template)
        if r.scope == "once":
            return render(text, global_context(services), r.template)
        chosen = [s for s in services.values() if r.scope in ("for each service", f"for each {s.kind}")]
        return "".join(render(text, service_context(s, services), r.template) for s in chosen)

    for rel in targets.REGION_FILES:
        path = root / rel
        if not path.is_file():
            raise GenerateError(f"{rel} is missing")
        out[rel] = fill_regions(path.read_text(), region, rel)
    stale = {
        str(p.relative_to(root)) for pattern in targets.GENERATED_GLOBS for p in root.glob(pattern)
        if targets.is_generated(p) and str(p.relative_to(root)) not in out
    }
    return out, stale


def diffs(root: Path) -> list[str]:
    """What differs from what `generate` would write: one message (with a diff) per file."""
    want, stale = expected(root)
    problems = []
    for rel, content in want.items():
        path = root / rel
        have = path.read_text() if path.is_file() else ""
        if have != content:
            diff = "".join(list(difflib.unified_diff(
                have.splitlines(keepends=True), content.splitlines(keepends=True),
                f"{rel} (committed)", f"{rel} (generated)", n=1))[:40])
            state = "differs from" if path.is_file() else "is missing from"
            problems.append(f"{rel} {state} what services.toml and the templates give:\n{diff}")
    problems += [f"{rel} is generated for a service services.toml does not list" for rel in sorted(stale)]
    return problems


def write(root: Path) -> list[str]:
    want, stale = expected(root)
    changed = []
    for rel, content in want.items():
        path = root / rel
        if not path.is_file() or path.read_text() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            changed.append(rel)
    for rel in sorted(stale):
        path = root / rel
        path.unlink()
        changed.append(rel)
        parent = path.parent
        while parent != root and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return changed


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        if argv == ["--check"]:
            problems = diffs(ROOT)
            for p in problems:
                print(f"generate --check: {p}", file=sys.stderr)
            if problems:
                print("generate --check: run scripts/generate (and commit what it writes)", file=sys.stderr)
                return 1
            return 0
        for rel in write(ROOT):
            print(rel)
    except (GenerateError, OSError) as err:
        print(f"generate: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
