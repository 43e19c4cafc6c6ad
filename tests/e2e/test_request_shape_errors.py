"""A request of the right path with the wrong method or a body of the wrong shape says what the route takes:
every path's 405 names all of its methods (``Allow`` and the message), and a document batch wrapped in an
object, as other services take it, is told to send the list itself."""

from __future__ import annotations

import re

METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH")


def concrete(template: str) -> str:
    """A path the template matches: each parameter a plain value (a collection's, ``default``)."""
    return re.sub(r"\{collection\}", "default", re.sub(r"\{(?!collection\})[^}]+\}", "x", template))


def test_every_path_answers_a_wrong_method_405_naming_all_its_methods(client):
    paths = client.get("/openapi.json").json()["paths"]
    templates = {
        re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"): {m.upper() for m in operations}
        for template, operations in paths.items()
    }
    checked = 0
    for template in paths:
        path = concrete(template)
        takes = set().union(*(methods for regex, methods in templates.items() if regex.match(path)))
        wrong = next(method for method in METHODS if method not in takes)
        reply = client.request(wrong, path)
        assert reply.status_code == 405, (wrong, path, reply.text)
        assert set(reply.headers["allow"].split(", ")) == takes, (wrong, path)
        assert (
            reply.json()["error"] == f"{wrong} is not a method of {path}: it takes {', '.join(sorted(takes))}"
        )
        checked += 1
    assert checked == len(paths) > 30
    documents = client.post("/documents", json=[{"id": "a", "text": "b"}])
    assert documents.headers["allow"] == "GET, PUT", documents.text  # listing and upserting, not only PUT's
    docs = client.post("/docs")
    assert docs.status_code == 405 and docs.headers["allow"] == "GET, HEAD"


def test_a_document_batch_wrapped_in_an_object_is_told_to_send_the_list(client):
    for path in ("/documents", "/collections/default/documents"):
        reply = client.put(path, json={"documents": [{"id": "wrapped-batch", "text": "a wrapped batch"}]})
        assert reply.status_code == 422
        assert reply.json() == {
            "error": "body: a list of documents is expected (a JSON array, [{...}, ...]), not an object: "
            "send the array under 'documents' itself as the body",
            "field": "body",
        }
    alone = client.put("/documents", json={"id": "wrapped-batch", "text": "one document, not in a list"})
    assert alone.status_code == 422 and "a list of documents is expected" in alone.json()["error"]
    assert client.get("/documents/wrapped-batch").status_code == 404  # nothing was written
