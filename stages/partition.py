"""DVC stage `partition`: read params.yaml, run `clusterfed.stages.partition`, write the declared outs."""

from clusterfed.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["partition"]))
