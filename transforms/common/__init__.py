"""What several rule families share, one idea per module.

A helper that one family alone uses stays in that family's module, and families never import helpers
from each other: a second family that needs one moves it here. What a family may import from another is
a declaration, a `Rule`, where its checker reports under that rule's id (a `--backend nccl` in a launch
script is NPU301, like the same backend in Python).
"""
