"""The engine: rules, checkers and fixes, and one file's way through them.

- the rule contract and the one registry: `rule`, `registry`;
- finding sites: `checkers` (libcst, `ast` and text checkers), `sites` (what a checker reports at a site),
  `context` (per-file state), `astindex` and `markers` (the prefilters that spare a parse);
- editing: `fixes`, `scoped` (edits without parsing the whole module), `positions`, `lines` (line counting,
  suppressions, inline TODOs), `layout` and `templating` (code the rules inject);
- running: `pipeline` (read -> prefilter -> parse -> rules -> fixes -> validate -> diff/write) and `runner`
  (the process pool); `textfiles` is the engine of files without a Python syntax tree;
- re-runs: `cache` (per-file results keyed by what determines them) and `depends` (the other files a
  result read, which its cache entry is checked against).

The rules themselves live in `npu_migrate.transforms`, one module per family.
"""
