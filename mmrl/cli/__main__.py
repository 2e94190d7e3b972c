"""`python -m mmrl.cli`: the `mmrl` command."""
from mmrl.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
