#!/usr/bin/env python3
"""Checks Grafana dashboard JSON files and lists the Prometheus metrics they query.

    check-dashboards.py DASHBOARD.json|DIR ...                 # check, print the metric names
    check-dashboards.py --known metric-names.txt DASHBOARD.json ...

For every dashboard (a directory stands for its *.json files):

* the dashboard has a non-empty `uid` and `title`, and no other dashboard has its uid;
* every panel, rows' nested panels included, has an integer `id` unique in the dashboard;
* every panel with queries has a datasource (an object with a `uid`, on the panel or on
  each target), and every target has an `expr`;
* every metric name in a target's `expr` (and in `label_values(metric, ...)` /
  `query_result(...)` variable queries) is collected: string literals, label matchers
  `{...}`, range/subquery brackets, `by`/`without`/`on`/`ignoring`/`group_*` label
  lists, `offset`/`@` modifiers, Grafana variables, numbers, durations, keywords and
  function or aggregation names are dropped; what is left are metric names (plus the
  name of a `{__name__="..."}` matcher).

The names are printed one a line, sorted, with the histogram/summary series suffixes
`_bucket`, `_count` and `_sum` removed (`saga_duration_seconds_bucket` prints as
`saga_duration_seconds`).

With `--known FILE`, every name must be known. FILE has one metric per line: the name,
optionally followed by its type (`counter`, `gauge`, `histogram`, `summary`,
`untyped`); `#` starts a comment, except that `# TYPE <name> <type>` lines (as in a
Prometheus /metrics page) declare a metric too. A name used as written is known when
FILE lists it; `X_bucket`/`X_count`/`X_sum` are known when FILE lists X with no type or
as a histogram (a summary has `_count`/`_sum` only). A histogram used without a suffix
is an error: Prometheus stores no series under its bare name. So a FILE of base names
(as in deploy/observability/metric-names.txt) and one of the series names Prometheus
holds (`..._bucket` listed as such) both work.

Exit status: 0 if every check passed, 1 if any failed (each problem printed to stderr),
2 on a usage error or a file that is not JSON. Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

SUFFIXES = ("_bucket", "_count", "_sum")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset", "gaugehistogram"}

# Words of PromQL that are not metric names when they stand without a `(` after them.
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan",
}

_NAME_MATCHER = re.compile(r"""__name__\s*=\s*["'`]([A-Za-z_:][A-Za-z0-9_:]*)["'`]""")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', re.S)
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$__[A-Za-z_]+|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[^\]]*\]\]")
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.I)
_OFFSET = re.compile(r"\boffset\s+-?[0-9][0-9a-zA-Z.]*", re.I)
_AT = re.compile(r"@\s*(?:start\s*\(\s*\)|end\s*\(\s*\)|[-+]?[0-9][0-9.eE+-]*)")
_TOKEN = re.compile(
    r"(?P<number>0[xX][0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?[a-zA-Z0-9_]*)"
    r"|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)(?P<call>\s*\()?"
)


def metric_names(expr: str) -> set[str]:
    """Metric names (as written, suffixes kept) that a PromQL expression selects."""
    # `{__name__="x"}` selects x (a regex match `=~` selects no name that can be checked).
    names: set[str] = set(_NAME_MATCHER.findall(expr))
    text = _STRING.sub(" ", expr)
    text = _GRAFANA_VAR.sub(" 0 ", text)
    # Label matchers, then ranges/subqueries, then grouping label lists: none nests.
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _AT.sub(" ", text)
    for m in _TOKEN.finditer(text):
        ident = m.group("ident")
        if ident is None or m.group("call") is not None or ident.lower() in KEYWORDS:
            continue
        names.add(ident)
    return names


def variable_query_exprs(query: str) -> list[str]:
    """The PromQL parts of a Grafana Prometheus variable query."""
    query = query.strip()
    m = re.fullmatch(r"label_values\s*\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)", query, re.S)
    if m:
        return [m.group(1)]
    m = re.fullmatch(r"query_result\s*\((.*)\)", query, re.S)
    if m:
        return [m.group(1)]
    # label_values(label), label_names(), metrics(regex): no metric selected.
    return []


def base_name(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    # metric name as written -> where it is used
    used: dict[str, list[str]] = field(default_factory=dict)

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def use(self, name: str, where: str) -> None:
        self.used.setdefault(name, []).append(where)


def walk_panels(panels: Any) -> Iterator[dict[str, Any]]:
    for panel in panels if isinstance(panels, list) else []:
        if not isinstance(panel, dict):
            continue
        yield panel
        # A collapsed row keeps its panels inside it.
        yield from walk_panels(panel.get("panels"))


def has_datasource(ds: Any) -> bool:
    return isinstance(ds, dict) and isinstance(ds.get("uid"), str) and bool(ds["uid"].strip())


def check_dashboard(path: Path, dash: Any, report: Report, uids: dict[str, Path]) -> None:
    if not isinstance(dash, dict):
        report.problem(f"{path}: not a dashboard object")
        return
    for key in ("uid", "title"):
        value = dash.get(key)
        if not isinstance(value, str) or not value.strip():
            report.problem(f"{path}: dashboard has no {key}")
    uid = dash.get("uid")
    if isinstance(uid, str) and uid:
        if uid in uids:
            report.problem(f"{path}: uid {uid!r} is also the uid of {uids[uid]}")
        uids[uid] = path
    ids: dict[Any, str] = {}
    for panel in walk_panels(dash.get("panels")):
        title = panel.get("title") or "(untitled)"
        pid = panel.get("id")
        where = f"{path}: panel {pid} {title!r}"
        if not isinstance(pid, int) or isinstance(pid, bool):
            report.problem(f"{where}: no integer id")
        elif pid in ids:
            report.problem(f"{where}: duplicate panel id {pid} (also {ids[pid]!r})")
        else:
            ids[pid] = title
        if panel.get("type") == "row":
            continue
        targets = panel.get("targets") or []
        if not targets:
            continue
        panel_ds = has_datasource(panel.get("datasource"))
        for target in targets:
            ref = target.get("refId", "?") if isinstance(target, dict) else "?"
            twhere = f"{where} target {ref}"
            if not isinstance(target, dict):
                report.problem(f"{twhere}: not an object")
                continue
            if not panel_ds and not has_datasource(target.get("datasource")):
                report.problem(f"{twhere}: no datasource (panel or target, with a uid)")
            ds = target.get("datasource") if has_datasource(target.get("datasource")) else panel.get("datasource")
            if isinstance(ds, dict) and ds.get("type") not in (None, "prometheus"):
                continue  # e.g. a Jaeger trace search: no PromQL to check
            expr = target.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                report.problem(f"{twhere}: no expr")
                continue
            names = metric_names(expr)
            if not names:
                report.problem(f"{twhere}: expr selects no metric: {expr!r}")
            for name in names:
                report.use(name, twhere)
    for var in (dash.get("templating") or {}).get("list") or []:
        if not isinstance(var, dict) or var.get("type") != "query":
            continue
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if not isinstance(query, str):
            query = var.get("definition") or ""
        where = f"{path}: variable {var.get('name')!r}"
        if not has_datasource(var.get("datasource")):
            report.problem(f"{where}: no datasource (an object with a uid)")
        for expr in variable_query_exprs(query):
            for name in metric_names(expr):
                report.use(name, where)


def check_rules(path: Path, report: Report) -> None:
    """Collects the metric names of every alerting/recording rule's `expr` in `path`."""
    import yaml  # PyYAML: only needed for rule files

    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        raise ValueError("not a Prometheus rule file (no `groups` list)")
    for group in doc["groups"]:
        for rule in group.get("rules") or []:
            name = rule.get("alert") or rule.get("record") or "?"
            expr = rule.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                report.problem(f"{path}: rule {name} has no expr")
                continue
            for metric in metric_names(expr):
                report.use(metric, f"{path}: {name}")


def load_known(path: Path) -> dict[str, str | None]:
    """{metric name: type or None} from a --known file."""
    known: dict[str, str | None] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        m = re.fullmatch(r"#\s*TYPE\s+(\S+)\s+(\S+)", line)
        if m:
            name, kind = m.group(1), m.group(2).lower()
        else:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            words = line.split()
            if len(words) > 2 or not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", words[0]):
                raise ValueError(f"{path}:{number}: expected `metric_name [type]`, got {raw!r}")
            name, kind = words[0], (words[1].lower() if len(words) == 2 else None)
        if kind is not None and kind not in TYPES:
            raise ValueError(f"{path}:{number}: unknown metric type {kind!r}")
        if known.get(name) is None:
            known[name] = kind
    return known


def check_known(report: Report, known: dict[str, str | None]) -> None:
    for name in sorted(report.used):
        where = report.used[name][0]
        more = f" (and {len(report.used[name]) - 1} more)" if len(report.used[name]) > 1 else ""
        if name in known:
            if known[name] == "histogram":
                report.problem(f"{name}: a histogram has no series of that name; use "
                               f"{name}_bucket/_count/_sum ({where}{more})")
            continue
        base = base_name(name)
        suffix = name[len(base):]
        if base != name and base in known:
            kind = known[base]
            if kind in (None, "histogram") or (kind == "summary" and suffix != "_bucket"):
                continue
            report.problem(f"{name}: {base} is a {kind}, it has no {suffix} series ({where}{more})")
            continue
        report.problem(f"{name}: not a known metric ({where}{more})")


def dashboard_files(args: list[str]) -> list[Path]:
    files: list[Path] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            files.extend(sorted(path.glob("*.json")))
        else:
            files.append(path)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dashboards", nargs="+", help="dashboard JSON files or directories of them")
    parser.add_argument("--known", type=Path, metavar="FILE",
                        help="metric names that exist, one a line (optionally `name type`)")
    parser.add_argument("--quiet", action="store_true", help="do not print the metric names")
    parser.add_argument("--rules", type=Path, metavar="FILE", action="append", default=[],
                        help="a Prometheus rule file whose expressions' metrics count as used too")
    args = parser.parse_args(argv)

    files = dashboard_files(args.dashboards)
    if not files:
        parser.error("no dashboard files")
    report = Report()
    uids: dict[str, Path] = {}
    for path in files:
        try:
            dash = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"check-dashboards: {path}: {e}", file=sys.stderr)
            return 2
        check_dashboard(path, dash, report, uids)
    for rules in args.rules:
        try:
            check_rules(rules, report)
        except (OSError, ValueError, ImportError) as e:
            print(f"check-dashboards: {rules}: {e}", file=sys.stderr)
            return 2
    if args.known is not None:
        try:
            check_known(report, load_known(args.known))
        except (OSError, ValueError) as e:
            print(f"check-dashboards: {e}", file=sys.stderr)
            return 2

    if not args.quiet:
        for name in sorted({base_name(n) for n in report.used}):
            print(name)
    for problem in report.problems:
        print(f"FAIL {problem}", file=sys.stderr)
    status = "failed" if report.problems else "ok"
    print(f"check-dashboards: {len(files)} dashboards, {len({base_name(n) for n in report.used})} metrics, "
          f"{len(report.problems)} problems: {status}", file=sys.stderr)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
