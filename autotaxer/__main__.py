"""``python -m autotaxer`` runs the command-line interface."""

from autotaxer.cli import main

if __name__ == "__main__":
    main()
