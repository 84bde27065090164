"""Zero-shot text classification on an embedding model, as a forkless IO processor plugin.

``POST /pooling`` with ``{"data": {"texts": [...], "labels": [...], "top_k": 2}}`` answers,
per text, the ``top_k`` labels whose embeddings are nearest to the text's (cosine), with
their similarity as the score. Each label is embedded once: the first request that names
it pools it with its texts, later requests reuse the cached vector.

Entry point (group ``forkless.io_processor_plugins``): :func:`zero_shot` returns the
processor's class path; select it with ``forkless serve MODEL --io-processor-plugin zero_shot``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from forkless.io_processors import IOProcessor
from forkless.pooling_params import PoolingParams


def zero_shot() -> str:
    """The entry point: the processor's class path (imported only by the API server)."""
    return "forkless_example_io_processor:ZeroShotClassifier"


class ZeroShotClassifier(IOProcessor[dict, dict]):
    """Nearest labels by embedding cosine similarity."""

    def __init__(self, vllm_config: Any, renderer: Any = None) -> None:
        super().__init__(vllm_config, renderer)
        self.label_vectors: dict[str, np.ndarray] = {}
        # Per request: its texts, labels, top_k, and the labels its prompts embed first.
        self._pending: dict[str | None, tuple[list[str], list[str], int, list[str]]] = {}
        self.labels_embedded = 0  # how many label prompts were ever pooled (tests read it)

    def parse_data(self, data: Any) -> dict:
        if not isinstance(data, dict):
            raise ValueError(f"data must be an object with 'texts' and 'labels', got {type(data).__name__}")
        texts, labels = data.get("texts"), data.get("labels")
        for name, value in (("texts", texts), ("labels", labels)):
            if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
                raise ValueError(f"data.{name} must be a non-empty list of non-empty strings")
        top_k = data.get("top_k", 1)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= len(labels):
            raise ValueError(f"data.top_k must be an integer from 1 to {len(labels)}, got {top_k!r}")
        return {"texts": texts, "labels": list(dict.fromkeys(labels)), "top_k": top_k}

    def merge_pooling_params(self, params: PoolingParams | None = None) -> PoolingParams:
        return PoolingParams(task="embed", normalize=True)

    def pre_process(self, prompt: dict, request_id: str | None = None, **kwargs: Any) -> list[str]:
        new_labels = [label for label in prompt["labels"] if label not in self.label_vectors]
        self._pending[request_id] = (prompt["texts"], prompt["labels"], prompt["top_k"], new_labels)
        return [*new_labels, *prompt["texts"]]

    def post_process(self, model_output: Sequence[Any], request_id: str | None = None, **kwargs: Any) -> dict:
        texts, labels, top_k, new_labels = self._pending.pop(request_id)
        for label, out in zip(new_labels, model_output):
            self.label_vectors[label] = np.asarray(out.outputs.data, dtype=np.float32)
        self.labels_embedded += len(new_labels)
        matrix = np.stack([self.label_vectors[label] for label in labels])
        answers = []
        for text, out in zip(texts, model_output[len(new_labels):]):
            sims = matrix @ np.asarray(out.outputs.data, dtype=np.float32)
            best = np.argsort(-sims)[:top_k]
            answers.append({"text": text, "labels": [{"label": labels[i], "score": float(sims[i])} for i in best]})
        return {"results": answers, "labels_embedded": self.labels_embedded}
