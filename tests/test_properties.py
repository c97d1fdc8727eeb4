"""Property-based tests: whatever the input, the engine leaves a file byte-identical or produces code
that parses, and a second apply changes nothing. Mutation tests keep the fixtures' rewrites working when
the code around them changes shape."""

from __future__ import annotations

import ast

import hypothesmith
import pytest
from conftest import FIXTURES
from hypothesis import example, given
from hypothesis import strategies as st

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.files.source import SourceError

# Statements a CUDA training script is made of, look-alikes included.
SNIPPETS = [
    "x = torch.ones(2).cuda()",
    "y = x.cuda(non_blocking=True)",
    "z = x.to('cuda:0')",
    "device = 'cuda' if torch.cuda.is_available() else 'cpu'",
    "torch.cuda.synchronize()",
    "th.cuda.empty_cache()",
    "tc.manual_seed(0)",
    "sync()",
    "g = torch.cuda.CUDAGraph()",
    "cap = torch.cuda.get_device_capability()[0]",
    "dist.init_process_group(backend='nccl')",
    "os.environ['CUDA_VISIBLE_DEVICES'] = '0,1'",
    "scaler = torch.cuda.amp.GradScaler()",
    "flag = args.cuda",
    "v = torch.version.cuda",
    "cuda = make()",
    "print('running on cuda')",
    "s = f'cuda:{rank}'",
    "if x.device.type == 'cuda':\n    pass",
    "def cuda(self):\n    return self",
    "with torch.autocast(device_type='cuda'):\n    out = model(x)",
    "torch.npu.synchronize()  # npu-migrate: ignore",
    "# a comment about .cuda()",
    '"""docstring mentioning cuda"""',
]
HEADERS = [
    "import torch\n",
    "import torch as th\nimport torch.cuda as tc\nfrom torch.cuda import synchronize as sync\n",
    "import os\nimport torch\nimport torch.distributed as dist\n",
    "",
]


@st.composite
def cuda_programs(draw):
    header = draw(st.sampled_from(HEADERS))
    body = draw(st.lists(st.sampled_from(SNIPPETS), min_size=1, max_size=12))
    indent_some = draw(st.booleans())
    lines = []
    for snippet in body:
        if indent_some and draw(st.booleans()):
            lines.append("if True:")
            snippet = "\n".join("    " + line for line in snippet.splitlines())
        lines.append(snippet)
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    text = header + "\n".join(lines) + draw(st.sampled_from(["\n", ""]))
    return text.replace("\n", newline) if newline != "\n" else text


def _check(source: str, **kwargs) -> None:
    try:
        migrated, _ = migrate_text(source, **kwargs)
    except SourceError:
        return  # reported as a failed file, never written
    if migrated != source:
        ast.parse(migrated)
    again, _ = migrate_text(migrated, **kwargs)
    assert again == migrated, "a second apply must change nothing"


@given(cuda_programs())
def test_cuda_programs_migrate_to_valid_code_idempotently(source):
    _check(source)


@given(cuda_programs())
@example(source="x = torch.ones(2).cuda()\ndef cuda(self):\n    return self\n")  # TODO above line 1: header
def test_annotated_migration_is_valid_and_idempotent(source):
    _check(source, annotate=True)


@given(hypothesmith.from_grammar(auto_target=False))
def test_arbitrary_python_never_crashes_the_engine(source):
    # Random grammar-valid programs rarely mention CUDA; a marker line makes every rule family look.
    _check("import torch\nx = torch.ones(1).cuda()  # cuda nccl rsqrt silu\n" + source)


@given(hypothesmith.from_grammar(auto_target=False))
def test_files_without_markers_are_untouched(source):
    if "cuda" in source or "nccl" in source:
        return
    try:
        migrated, findings = migrate_text(source)
    except SourceError:
        return
    if not any(m in source for m in ("rsqrt", "silu", "CUDA_", "NCCL_", "autocast", "GradScaler")):
        assert migrated == source and findings == []


# -- mutation tests -------------------------------------------------------------------------------------

POSITIVES = sorted(p for p in (FIXTURES / "rules").glob("*/*.in.py") if p.with_name(p.name[:-6] + ".out.py").exists())


def _select(case):
    select_file = case.parent / "select.txt"
    return select_file.read_text().strip().split(",") if select_file.exists() else [case.parent.name]


def _version(case):
    """The torch_npu version a fixture folder names (`version.txt`), as tests/test_fixtures.py reads it."""
    version_file = case.parent / "version.txt"
    return version_file.read_text().strip() if version_file.exists() else None


def _crlf(text):
    return text.replace("\n", "\r\n")


def _header_comments(text):
    return "# header comment mentioning cuda\n\n# another\n" + text if not text.startswith("#!") else text


def _indented(text):
    return "if True:\n" + "".join("    " + line if line.strip() else line for line in text.splitlines(True))


MUTATIONS = {"crlf": _crlf, "header-comments": _header_comments, "indented": _indented}


def _applies(case, mutation) -> bool:
    """Indenting the whole module changes what module level means (future imports, docstrings, and where
    `import torch_npu` or the fused prelude go), so those fixtures get the other mutations only."""
    if mutation != "indented":
        return True
    source = case.read_text()
    return not (
        "from __future__" in source
        or '"""' in source
        or "'''" in source
        or case.parent.name == "NPU001"
        or case.parent.name.startswith("NPU7")
    )


PAIRS = [(case, mutation) for case in POSITIVES for mutation in MUTATIONS if _applies(case, mutation)]


@pytest.mark.parametrize("case, mutation", PAIRS, ids=[f"{c.parent.name}/{c.name[:-6]}-{m}" for c, m in PAIRS])
def test_rewrites_survive_mutations(case, mutation):
    source = case.read_text()
    expected = case.with_name(case.name[:-6] + ".out.py").read_text()
    mutate = MUTATIONS[mutation]
    migrated, _ = migrate_text(mutate(source), select=_select(case), torch_npu_version=_version(case))
    assert migrated == mutate(expected)
