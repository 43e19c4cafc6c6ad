"""Documents: insert or replace (embedded through the service's batcher, as queries are), read, delete."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response

from app.service.collections import Collection
from app.service.errors import ApiError, BodyRejected
from app.service.route_table import declare
from app.service.routes.collections import current_collection
from app.service.schemas import DeleteResponse, DocumentIn, DocumentOut, DocumentPage, UpsertResponse
from app.service.validation import (
    StrictJSONRoute,
    check_filter,
    check_filter_fields,
    check_metadata,
    strict_loads,
)
from index.build.builder import attach_vectors, chunk_texts
from index.build.own_vectors import InvalidVector, OwnVectors
from index.records import Document, InvalidCursor, Landed, id_problem, text_problem
from index.search_index import MAX_LIST_LIMIT

router = APIRouter(route_class=StrictJSONRoute)
InCollection = Annotated[Collection, Depends(current_collection)]
DocumentId = Annotated[str, Path(min_length=1, max_length=512)]
AckMode = Annotated[
    Literal["local", "remote"] | None,
    Query(
        description="With replication (`CLOZE_REPLICATION_ROLE=writer`): `remote` answers once the write is "
        "durable in the bucket (503 if it is not in time), `local` once it is on the writer's disk; unset: "
        "`CLOZE_REPLICATION_ACK`"
    ),
]


@router.put(
    "/documents",
    openapi_extra=declare("write", "collection"),
    response_model=UpsertResponse,
    tags=["documents"],
)
async def upsert_documents(
    documents: Annotated[list[DocumentIn], Body(min_length=1, fail_fast=True)],
    request: Request,
    collection: InCollection,
    ack: AckMode = None,
) -> UpsertResponse:
    """Insert or replace. When this answers 200 the documents are committed to disk and, with `searchable`
    true, found by search; `searchable` false: applying them to the search structures failed, and the next
    write or the next poll applies them again."""
    settings, engines = request.app.state.settings, request.app.state.engines
    if len(documents) > settings.max_inputs:
        raise ApiError(
            422, f"body: {len(documents)} documents, more than the limit of {settings.max_inputs}", "body"
        )
    ids = [doc.id for doc in documents]
    if len(set(ids)) != len(ids):
        raise ApiError(422, "body: the same id appears twice in one batch", "id")
    own = collection.info.own_vectors()
    for position, doc in enumerate(documents):
        where = str(position)  # as FastAPI names a field of a list body: "0.text"
        if problem := id_problem(doc.id):
            raise ApiError(422, f"{where}.id: {problem}", f"{where}.id")
        _check_vector(doc, where, own, collection)
        if problem := text_problem(doc.text, settings.document_limits(), required=own is None):
            raise ApiError(422, f"{where}.text: {problem}", f"{where}.text")
        check_metadata(doc.metadata, f"{where}.metadata", settings)
    index = collection.writable_index()
    mode = request.app.state.replication.admit(collection.name, ack)
    if own is not None:
        landed = await engines.write_pool.run(_commit_own_vectors, index, own, documents)
        await request.app.state.replication.acknowledge(mode, collection, index)
        return UpsertResponse(upserted=landed.upserted, searchable=landed.searchable)
    engines.require_encoder(collection.model)
    # Chunk, embed through the batcher beside the queries (bulk: they go first), then commit: one write at
    # a time holds the index's writer lock, never while it embeds.
    chunked = await engines.write_pool.run(
        index.prepare, [Document(d.id, d.text, d.metadata) for d in documents]
    )
    _, vectors = await engines.embed(chunk_texts(chunked), normalize=True, bulk=True, model=collection.model)
    landed = await engines.write_pool.run(index.commit, attach_vectors(chunked, vectors))
    await request.app.state.replication.acknowledge(mode, collection, index)
    return UpsertResponse(upserted=landed.upserted, searchable=landed.searchable)


def _check_vector(doc: DocumentIn, where: str, own: OwnVectors | None, collection: Collection) -> None:
    """A model's collection embeds each document's text; a collection of the caller's own vectors takes
    one vector per document, and text only to search it by words (BM25, hybrid: ``text_problem``)."""
    if own is None and doc.vector is not None:
        raise ApiError(
            422,
            f"{where}.vector: the collection {collection.name!r} embeds text with its model "
            f"{collection.model!r}; vectors you compute go in a collection created with a `dimension`",
            f"{where}.vector",
        )
    if own is not None and doc.vector is None:
        raise ApiError(
            422, f"{where}.vector: required in a collection of your own vectors", f"{where}.vector"
        )


def _commit_own_vectors(index: Any, own: OwnVectors, documents: list[DocumentIn]) -> Landed:
    """Check the supplied vectors (422 naming the first bad one), then commit as a model's upsert does."""
    try:
        vectors = own.vectors(
            [d.vector or [] for d in documents], [f"{i}.vector" for i in range(len(documents))]
        )
    except InvalidVector as exc:
        raise ApiError(422, str(exc), exc.field) from exc
    chunked = index.prepare([Document(d.id, d.text, d.metadata) for d in documents])
    return index.commit(attach_vectors(chunked, vectors))


@router.get(
    "/documents",
    openapi_extra=declare("read", "collection"),
    response_model=DocumentPage,
    response_class=Response,
    tags=["documents"],
)
async def list_documents(
    request: Request,
    collection: InCollection,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT, description="documents in this page")] = 100,
    cursor: Annotated[
        str | None, Query(max_length=1024, description="`next_cursor` of the last page")
    ] = None,
    filter: Annotated[
        str | None, Query(max_length=65_536, description="a filter as JSON, the shape `/search` takes")
    ] = None,
) -> DocumentPage:
    """The stored documents in a stable order (by id), a page at a time: paging while writes land neither
    repeats nor skips a document that exists the whole time. ``total`` counts every match. A page holds
    `limit` documents or fewer: it ends after `CLOZE_MAX_PAGE_BYTES` of texts and metadata (always at least
    one document); follow `next_cursor`."""
    settings, engines = request.app.state.settings, request.app.state.engines
    tree = None
    if filter is not None:
        try:
            raw = strict_loads(filter.encode(), settings.max_body_values)
        except BodyRejected as exc:
            raise ApiError(422, f"filter: {exc.detail}", "filter") from None
        if not isinstance(raw, dict):
            raise ApiError(422, "filter: a JSON object, as /search takes", "filter")
        tree = check_filter(raw, settings)
    index = collection.require_index()
    await check_filter_fields(index, tree, settings, engines.work_pool)
    try:
        (
            page,
            next_cursor,
            total,
        ) = await engines.work_pool.run(  # one read: the total counts this page's state
            index.document_page, limit, cursor, tree, settings.max_page_bytes
        )
        # Up to CLOZE_MAX_PAGE_BYTES of text: serialised in a worker thread, not on the event loop.
        body = await engines.work_pool.run(page_json, page, next_cursor, total)
    except InvalidCursor as exc:
        raise ApiError(422, f"cursor: {exc}", "cursor") from exc
    return Response(body, media_type="application/json")


def page_json(page: list[Document], next_cursor: str | None, total: int) -> bytes:
    documents = [DocumentOut(id=d.id, text=d.text, metadata=d.metadata) for d in page]
    return DocumentPage(documents=documents, next_cursor=next_cursor, total=total).model_dump_json().encode()


@router.get(
    "/documents/{doc_id:path}",
    openapi_extra=declare("read", "collection"),
    response_model=DocumentOut,
    tags=["documents"],
)
async def get_document(doc_id: DocumentId, request: Request, collection: InCollection) -> DocumentOut:
    engines = request.app.state.engines
    document = await engines.work_pool.run(collection.require_index().get, doc_id)
    if document is None:
        raise ApiError(404, f"no document with id {doc_id!r}", "doc_id")
    return DocumentOut(id=document.id, text=document.text, metadata=document.metadata)


@router.delete(
    "/documents/{doc_id:path}",
    openapi_extra=declare("write", "collection"),
    response_model=DeleteResponse,
    tags=["documents"],
)
async def delete_document(
    doc_id: DocumentId, request: Request, collection: InCollection, ack: AckMode = None
) -> DeleteResponse:
    engines, index = request.app.state.engines, collection.writable_index()
    mode = request.app.state.replication.admit(collection.name, ack)
    if not await engines.write_pool.run(index.delete, doc_id):
        raise ApiError(404, f"no document with id {doc_id!r}", "doc_id")
    await request.app.state.replication.acknowledge(mode, collection, index)
    return DeleteResponse(deleted=doc_id)
