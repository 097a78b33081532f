"""Writer: Prometheus text exposition 0.0.4, a few lines of text (no prometheus_client)."""

from __future__ import annotations

from dspark_loop.observe.histogram import Histogram, exposition_number


class Writer:
    """Prometheus text exposition 0.0.4; every sample carries the model_name label."""

    def __init__(self, model_name: str):
        self.base = {"model_name": model_name}
        self.lines: list[str] = []

    def gauge(self, name: str, help_: str, value: float) -> None:
        self._head(name, help_, "gauge")
        self._sample(name, {}, value)

    def gauges(self, name: str, help_: str, samples: list[tuple[dict, float]]) -> None:
        self._head(name, help_, "gauge")
        for labels, value in samples:
            self._sample(name, labels, value)

    def counter(self, name: str, help_: str, samples: list[tuple[dict, float]]) -> None:
        self._head(name + "_total", help_, "counter")
        for labels, value in samples:
            self._sample(name + "_total", labels, value)

    def histogram(self, name: str, help_: str, hist: Histogram) -> None:
        self._head(name, help_, "histogram")
        for le, n in hist.cumulative():
            self._sample(name + "_bucket", {"le": le}, n)
        self._sample(name + "_sum", {}, hist.sum)
        self._sample(name + "_count", {}, hist.count)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def _head(self, name: str, help_: str, kind: str) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")

    def _sample(self, name: str, labels: dict, value: float) -> None:
        pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in {**self.base, **labels}.items())
        self.lines.append(f"{name}{{{pairs}}} {exposition_number(value)}")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
