"""HERMES Live web app (not built yet: the streaming engine and UI land in later issues)."""

import sys

if __name__ == "__main__":
    sys.exit("HERMES Live: the web app is not built yet; the cache core is in hermes/ (see README).")
