"""What the playground pages need beyond the public API: a masking preview and the index's filter fields.

``/mask-preview`` runs the training code's own ``mask_tokens`` over one sentence, so what the page shows is
exactly what pre-training does to a batch — one implementation, never a JavaScript re-creation of it.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from app.service.errors import ApiError
from app.service.route_table import declare
from app.service.validation import StrictJSONRoute
from encoder_runtime.tokenization import TextTokenizer

router = APIRouter(tags=["playground"], route_class=StrictJSONRoute)
Action = Literal["mask", "random", "kept"]


class MaskPreviewRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, description="The sentence to corrupt")
    strategy: Literal["token", "whole_word", "span"] = "token"
    rate: float = Field(0.15, gt=0.0, lt=1.0, description="Share of (non-special) tokens selected")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Seed of the torch generator: same seed, same masks")


class PreviewToken(BaseModel):
    index: int
    token: str
    id: int
    special: bool = Field(description="CLS, SEP, ...: never selected")
    word_start: bool = Field(description="False for a WordPiece continuation (##ing)")
    selected: bool = Field(description="Chosen for the loss (its label is the original token)")
    action: Action | None = Field(None, description="What 80-10-10 did to a selected token")
    replacement: str = Field(description="The token the model sees instead (the same when kept)")


class MaskPreviewResponse(BaseModel):
    strategy: str
    rate: float
    seed: int
    model_id: str
    mask_token: str
    truncated: bool
    tokens: list[PreviewToken]
    counts: dict[str, int]


@router.post("/mask-preview", openapi_extra=declare("read"), response_model=MaskPreviewResponse)
async def mask_preview(body: MaskPreviewRequest, request: Request) -> MaskPreviewResponse:
    """One sentence through ``encoder_training.masking.mask_tokens`` with the serving model's tokenizer."""
    settings = request.app.state.settings
    if len(body.text) > settings.max_chars:
        raise ApiError(422, f"text: over the limit of {settings.max_chars} characters", "text")
    if not body.text.strip():
        raise ApiError(422, "text: empty or only whitespace", "text")
    tokenizer, model_id = _serving_tokenizer(request)
    if tokenizer.hf.mask_token is None:
        raise ApiError(422, f"the tokenizer of {model_id} has no mask token", "text")
    return await request.app.state.engines.work_pool.run(_preview, body, tokenizer, model_id)


def _serving_tokenizer(request: Request) -> tuple[TextTokenizer, str]:
    """The fill-mask model's tokenizer (the one that was pre-trained with masks), else the embedder's."""
    models = request.app.state.engines.models.default
    runtime = request.app.state.engines.fill_masks.default.runtime or models.runtime
    if runtime is None:
        raise ApiError(503, models.error or "model is loading", headers={"Retry-After": "2"})
    return runtime.tokenizer, runtime.info.model_id


def _preview(body: MaskPreviewRequest, tokenizer: TextTokenizer, model_id: str) -> MaskPreviewResponse:
    import torch

    from encoder_training.masking import MaskingConfig, continuation_table, mask_tokens

    hf = tokenizer.hf
    encoded = tokenizer.encode([body.text])[0]
    ids = torch.tensor([encoded.ids], dtype=torch.long)
    vocab_size = len(hf)
    specials = set(hf.all_special_ids)
    continuation = continuation_table(hf.get_vocab(), vocab_size)
    inputs, labels = mask_tokens(
        ids,
        mask_token_id=hf.mask_token_id,
        vocab_size=vocab_size,
        special_ids=specials,
        config=MaskingConfig(strategy=body.strategy, rate=body.rate),
        continuation=continuation,
        generator=torch.Generator().manual_seed(body.seed),
    )
    tokens = _describe(ids[0].tolist(), inputs[0].tolist(), labels[0].tolist(), hf, specials, continuation)
    return MaskPreviewResponse(
        strategy=body.strategy,
        rate=body.rate,
        seed=body.seed,
        model_id=model_id,
        mask_token=hf.mask_token,
        truncated=encoded.truncated,
        tokens=tokens,
        counts=_counts(tokens),
    )


def _describe(
    original: list[int],
    corrupted: list[int],
    labels: list[int],
    hf: Any,
    specials: set[int],
    continuation: Any,
) -> list[PreviewToken]:
    """A random draw that happens to pick the original token reads as "kept": the model sees the same input."""
    names, replaced = hf.convert_ids_to_tokens(original), hf.convert_ids_to_tokens(corrupted)
    out = []
    for i, (before, after, label) in enumerate(zip(original, corrupted, labels, strict=True)):
        selected = label != -100
        action: Action | None = None
        if selected:
            action = "mask" if after == hf.mask_token_id else "random" if after != before else "kept"
        out.append(
            PreviewToken(
                index=i,
                token=names[i],
                id=before,
                special=before in specials,
                word_start=not bool(continuation[before]) if before < len(continuation) else True,
                selected=selected,
                action=action,
                replacement=replaced[i],
            )
        )
    return out


def _counts(tokens: list[PreviewToken]) -> dict[str, int]:
    selected = [t for t in tokens if t.selected]
    return {
        "tokens": len(tokens),
        "candidates": sum(not t.special for t in tokens),
        "selected": len(selected),
        **{action: sum(t.action == action for t in selected) for action in ("mask", "random", "kept")},
    }
