"""The training-free streaming methods HERMES competes with, each as a scorer (and, where the
method needs one, its own selection or input filter) for the same engine (docs/design.md,
"Rivals")."""
