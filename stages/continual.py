"""DVC stage `continual`: read params.yaml, run `clusterfed.stages.continual`, write the declared outs."""

from clusterfed.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["continual"]))
