"""``python -m app.cli``: the same as the ``cloze`` script."""

from app.cli import main

main()
