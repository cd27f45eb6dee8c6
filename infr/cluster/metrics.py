"""The cluster's `/metrics`: every replica's `infr serve` metrics in one Prometheus text, each
sample labelled with its model and replica (so `sum by (model)` aggregates), each family's HELP
and TYPE once, and the ingress's own counters."""

from __future__ import annotations


def _labels(labels: dict) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def _relabel(sample: str, extra: str) -> str:
    name, _, value = sample.rpartition(" ")
    if "{" in name:
        base, rest = name.split("{", 1)
        return f"{base}{{{extra},{rest} {value}" if rest != "}" else f"{base}{{{extra}}} {value}"
    return f"{name}{{{extra}}} {value}"


def merge(parts: list[tuple[dict, str]], own: list[tuple[str, str, str, list[tuple[dict, float]]]]) -> str:
    """parts: (labels, one replica's metrics text); own: (name, type, help, [(labels, value)])
    families without the infr_ prefix."""
    families: dict[str, tuple[list[str], list[str]]] = {}  # name -> (HELP/TYPE lines, samples)
    for labels, text in parts:
        extra = _labels(labels)
        family = None
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split()[2]
                head, _ = families.setdefault(family, ([], []))
                if len(head) < 2 and line not in head:
                    head.append(line)
            elif line.strip() and family is not None:
                families[family][1].append(_relabel(line, extra))
    for name, kind, help_, samples in own:
        full = "infr_" + name
        families[full] = ([f"# HELP {full} {help_}", f"# TYPE {full} {kind}"],
                          [f"{full}{{{_labels(labels)}}} {value:g}" for labels, value in samples])
    lines: list[str] = []
    for head, samples in families.values():
        lines += head + samples
    return "\n".join(lines) + "\n"
