"""``python -m tenxstore.cli``: the ``tenxstore`` command."""

from . import main

main()
