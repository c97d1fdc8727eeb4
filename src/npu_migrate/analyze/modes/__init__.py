"""The analysis modes, one module each, named as the mode and exporting its `Mode` object as `MODE`.

They are listed, in report order, by the registry in `npu_migrate.analyze` (`REGISTRY`), which imports
them when first asked for. A mode imports another mode's module only for its helpers; it reads another
mode's result through `project.result(name)`, declared in its `reads`.
"""
