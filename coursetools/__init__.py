"""Tooling for the course *PyTorch devices, from `.to()` to DDP*.

Release, learner self-check, class grading and authoring helpers. Notebooks never import
this package: each one must run alone (in Colab, for instance).
"""
