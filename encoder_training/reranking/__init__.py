"""Cross-encoder rerankers trained on a user's judged queries (``cloze train reranker``): hard negatives
from the service's own hybrid first stage, the sentence-transformers cross-encoder trainer, a time budget."""
