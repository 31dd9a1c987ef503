"""The command line: python -m hermes {stream, bench, eval, build-tiny}."""
