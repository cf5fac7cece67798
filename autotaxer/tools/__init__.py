"""Developer tools (``python -m autotaxer.tools.<name>``); the library never imports them."""
