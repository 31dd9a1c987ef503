"""Video input: decoding files and webcam frames, and grouping them into chunks."""
