"""DVC stage `coldstart`: read params.yaml, run `clusterfed.stages.coldstart`, write the declared outs."""

from clusterfed.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["coldstart"]))
