"""lmms-eval adds this folder to its task folders (it requires one in every plugin); HERMES adds no tasks."""
