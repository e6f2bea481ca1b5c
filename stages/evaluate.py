"""DVC stage `evaluate`: read params.yaml, run `clusterfed.stages.evaluate`, write the declared outs."""

from clusterfed.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["evaluate"]))
