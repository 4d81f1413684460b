"""`python -m mmsparse.bench.search`: the search benchmark (see the package docstring)."""

from .cli import main

if __name__ == "__main__":
    main()
