"""Reading the Grafana dashboard's PromQL: the queries of its panels and template variables,
and the metric names, selector labels and grouping labels each one uses (a small tokenizer,
not a PromQL parser: enough to catch a misspelt metric or label). Used by the dashboard's unit
test and by the compose cpu profile's test against live ``/metrics``."""

from __future__ import annotations

import re

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan",
}
IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"


def queries(dash: dict) -> list[str]:
    """Every PromQL expression of ``dash`` (a dashboard's JSON): panel targets and the
    template variables' queries."""
    out = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for v in dash["templating"]["list"]:
        if v.get("type") == "query":
            out.append(v["query"]["query"] if isinstance(v["query"], dict) else v["query"])
    return out


def names_and_labels(expr: str) -> tuple[set[str], dict[str, set[str]], set[str]]:
    """Metric names, label names used in each selector, and labels in by/without clauses."""
    lv = re.fullmatch(rf"\s*label_values\(\s*({IDENT})\s*,\s*({IDENT})\s*\)\s*", expr)
    if lv:  # a template variable's query
        return {lv.group(1)}, {lv.group(1): {lv.group(2)}}, set()
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    e = re.sub(r"\[[^\]]*\]", "", e)  # range selectors [5m], [$__rate_interval]
    grouping: set[str] = set()
    for m in re.finditer(r"\b(?:by|without)\s*\(([^)]*)\)", e):
        grouping |= {x.strip() for x in m.group(1).split(",") if x.strip()}
    e = re.sub(r"\b(?:by|without)\s*\([^)]*\)", " ", e)
    selectors: dict[str, set[str]] = {}
    for m in re.finditer(rf"({IDENT})\s*\{{([^}}]*)\}}", e):
        labels = set(re.findall(rf"({IDENT})\s*(?:=~|!~|!=|=)", m.group(2)))
        selectors.setdefault(m.group(1), set()).update(labels)
    e = re.sub(r"\{[^}]*\}", " ", e)
    names = set()
    for m in re.finditer(rf"(?<![\w$.]){IDENT}", e):
        word, rest = m.group(0), e[m.end():]
        if rest.lstrip().startswith("(") or word.lower() in PROMQL_WORDS:
            continue  # a function call or a keyword
        names.add(word)
    return names, selectors, grouping
