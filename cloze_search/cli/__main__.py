"""``python -m cloze_search.cli``: the same as the ``cloze-client`` script."""

from cloze_search.cli import main

main()
