"""Named models: a slot per model (its runtime and batcher once loaded, or why not), and how a request's
``model`` (a body field, or the ``/models/{name}/...`` path prefix) finds one.

Each configured model loads once and has its own batcher, whatever number of routes and collections use it.
``default`` is the model ``CLOZE_MODEL`` configures; the collection ``default`` embeds with ``INDEX_MODEL``, each
other collection with the model its ``collection.json`` names."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Any

from app.service.errors import ApiError
from app.settings import DEFAULT_MODEL, model_name_problem
from encoder_runtime import MicroBatcher

# The collection ``default``'s vectors come from this model (the others name theirs).
INDEX_MODEL = DEFAULT_MODEL
MAX_REQUESTED_LENGTH = 256  # a name or an alias (a hub id); anything longer names nothing


@dataclass
class ModelSlot:
    name: str
    source: str  # as configured: a folder or a hub id; "" = the bundled (or shipped) model
    runtime: Any = None  # EncoderRuntime | FillMaskRuntime | RerankerRuntime, once loaded
    batcher: MicroBatcher | None = None
    error: str | None = None  # the last load failure; None while loading or once loaded

    @property
    def aliases(self) -> list[str]:
        """Other names a request may use: the model's id (e.g. its hub id) and the source as configured."""
        names = [self.source] if self.source else []
        if self.runtime is not None:
            names.append(self.runtime.info.model_id)
        return sorted({alias for alias in names if alias != self.name})

    @property
    def status(self) -> str:
        return "ready" if self.runtime is not None else "failed" if self.error else "loading"


@dataclass
class ModelRegistry:
    """The models of one task (embedding, fill-mask or rerank), by name, ``default`` first."""

    task: str  # "embedding" | "fill-mask" | "rerank": how errors name the models
    slots: dict[str, ModelSlot] = field(default_factory=dict)
    # Whether the task always has a ``default`` model (the bundled one unless configured). Rerankers have
    # none unless configured; then a request without ``model`` gets ``default`` if listed, else the first.
    bundled_default: bool = True

    @classmethod
    def from_sources(cls, task: str, sources: dict[str, str], bundled_default: bool = True) -> ModelRegistry:
        slots = {name: ModelSlot(name, source) for name, source in sources.items()}
        return cls(task, slots, bundled_default)

    def __post_init__(self) -> None:
        if self.bundled_default:
            self.slots.setdefault(DEFAULT_MODEL, ModelSlot(DEFAULT_MODEL, ""))

    @property
    def default_name(self) -> str | None:
        if DEFAULT_MODEL in self.slots:
            return DEFAULT_MODEL
        return next(iter(self.slots), None)

    @property
    def default(self) -> ModelSlot:
        if self.default_name is None:
            raise ApiError(404, f"no {self.task} model is served here (configure {self.setting})")
        return self.slots[self.default_name]

    @property
    def setting(self) -> str:
        return {"embedding": "CLOZE_MODELS", "fill-mask": "CLOZE_FILL_MASK_MODELS"}.get(
            self.task, f"CLOZE_{self.task.upper()}_MODELS"
        )

    def others(self) -> list[ModelSlot]:
        return [slot for name, slot in self.slots.items() if name != DEFAULT_MODEL]

    def find(self, requested: str | None, field_name: str = "model") -> ModelSlot:
        """The slot ``requested`` names (None: ``default``): by name, else by an alias only one model has.
        422 for a string that cannot name a model, 404 listing the served names for one that names none."""
        if requested is None:
            return self.default
        if requested in self.slots:
            return self.slots[requested]
        _refuse_malformed(requested, field_name)
        owners = [slot for slot in self.slots.values() if requested in slot.aliases]
        if len(owners) == 1:
            return owners[0]
        if owners:
            names = ", ".join(slot.name for slot in owners)
            raise ApiError(
                422,
                f"{field_name}: {requested!r} is an id of several models ({names}): send a name",
                field_name,
            )
        raise ApiError(
            404, f"{field_name}: no {self.task} model {requested!r} here; {self.served()}", field_name
        )

    def served(self) -> str:
        if not self.slots:
            return f"none is served (configure {self.setting})"
        return f"served: {', '.join(self.slots)} (each also answers to its model id)"

    def loaded(self, slot: ModelSlot) -> tuple[Any, MicroBatcher]:
        """The slot's runtime and batcher; 503 while it loads (with Retry-After) or after it failed."""
        if slot.runtime is None or slot.batcher is None:
            retry = None if slot.error else {"Retry-After": "2"}
            raise ApiError(503, slot.error or f"{self.task} model {slot.name!r} is loading", headers=retry)
        return slot.runtime, slot.batcher


def _refuse_malformed(requested: str, field_name: str) -> None:
    """422 for what no name or alias can be: overlong, or holding control characters (NUL included)."""
    if len(requested) > MAX_REQUESTED_LENGTH:
        raise ApiError(
            422, f"{field_name}: {len(requested)} characters, over {MAX_REQUESTED_LENGTH}", field_name
        )
    if any(unicodedata.category(char).startswith("C") for char in requested):
        raise ApiError(422, f"{field_name}: control characters cannot name a model", field_name)
    if "/" in requested:  # perhaps a hub id, an alias; never a path that climbs
        if ".." in requested.split("/"):
            raise ApiError(422, f"{field_name}: '..' cannot name a model", field_name)
    elif problem := model_name_problem(requested):
        raise ApiError(422, f"{field_name}: {requested!r} is not a model name: {problem}", field_name)
