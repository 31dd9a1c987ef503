"""The streaming engine: chunks in, compact memory kept, questions answered from it."""
