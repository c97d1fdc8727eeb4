"""The prefilters (`Checker.markers` on the text, `wants_words` on its words, then `Checker.wants` on the
file's `AstIndex`) may skip a
file only when its checker cannot report anything there: with them switched off, every file must come out
the same, findings included. They should also skip the files that merely mention what a rule is about."""

from __future__ import annotations

import ast
from contextlib import ExitStack, contextmanager
from unittest import mock

import hypothesmith
import pytest
from conftest import FIXTURES
from hypothesis import example, given
from hypothesis import strategies as st

from npu_migrate.engine import markers
from npu_migrate.engine.astindex import AstIndex, name_sets, text_words
from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.engine.registry import all_checkers
from npu_migrate.transforms import amp, backends, distributed
from npu_migrate.transforms.amp import AmpChecker
from npu_migrate.transforms.backends import BackendsChecker
from npu_migrate.transforms.cuda_api import CudaApiChecker
from npu_migrate.transforms.data_pipeline import DataPipelineChecker
from npu_migrate.transforms.device import DeviceChecker
from npu_migrate.transforms.distributed import DistributedChecker
from npu_migrate.transforms.environment import EnvironmentChecker
from npu_migrate.transforms.fused import FusedOpsChecker
from npu_migrate.transforms.fused.symbolic import nodes_of
from npu_migrate.transforms.startup import StartupChecker

FILTERED = [c for c in all_checkers() if c.markers]


@contextmanager
def no_prefilter():
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(markers, "ANY_MARKER", ("",)))
        for checker in FILTERED:
            stack.enter_context(mock.patch.object(checker, "markers", ("",)))  # "" is in every text
            stack.enter_context(mock.patch.object(checker, "wants", classmethod(lambda cls, index: True)))
            stack.enter_context(mock.patch.object(checker, "wants_words", classmethod(lambda cls, words: True)))
        yield


def _run(source: str, select=None):
    migrated, findings = migrate_text(source, select=select)
    return migrated, [(f.line, f.col, f.rule_id, f.message, f.fixed) for f in findings]


def assert_prefilter_changes_nothing(source: str, select=None) -> None:
    filtered = _run(source, select)
    with no_prefilter():
        assert _run(source, select) == filtered


def test_the_start_up_gate_lets_through_every_file_some_checker_wants():
    # A file holding a checker's marker holds a gate marker that is a part of it: the gate never skips
    # a file a checker would read, whatever the checkers declare next.
    uncovered = [
        (checker.__name__, marker)
        for checker in all_checkers()
        for marker in checker.markers
        if not any(gate in marker for gate in markers.ANY_MARKER)
    ]
    assert not uncovered, f"add these to npu_migrate.engine.markers.ANY_MARKER: {uncovered}"


def test_no_prefilter_really_switches_them_off():
    source = "x = 1\n"
    index = AstIndex.of(ast.parse(source))
    words = text_words(source)
    with no_prefilter():
        assert all(any(m in source for m in c.markers) and c.wants_words(words) and c.wants(index) for c in FILTERED)
    assert not any(c.wants(index) for c in FILTERED)
    assert any(c.wants_words(words) for c in FILTERED)  # only some checkers look at the words
    assert not FusedOpsChecker.wants_words(words)


# -- every key a checker looks for reaches it past the text markers --------------------------------------


@pytest.mark.parametrize(
    "checker, keys",
    [
        (BackendsChecker, [*backends._SPECS, *backends._GENERIC]),
        (CudaApiChecker, ["torch.cuda"]),
        (AmpChecker, [amp.PREFIX, *amp._RENAMED, *amp._DEVICE_TYPE_ARGS]),
        (
            DistributedChecker,
            [
                *distributed._BACKEND_ARGS,
                *distributed._RENAMED,
                *distributed._DATA_PARALLEL,
                *distributed._DEVICE_TYPE_ARGS,
                *distributed._DDP,
            ],
        ),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_every_key_has_a_marker_in_one_of_its_parts(checker, keys):
    # A file names a key through its parts (`from torch.backends import cudnn`), so the marker must be in
    # a part: "cuda.amp" would miss `from torch.cuda import amp`.
    for key in keys:
        assert any(marker in part for part in key.split(".") for marker in checker.markers), key


def _index_by_ast_walk(tree: ast.AST) -> tuple[set[str], set[str]]:
    """What AstIndex.of must find, the plain way."""
    names, strings = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) <= 200:
            strings.add(node.value)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
            names.update([node.asname] if node.asname else [])
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(node.module.split("."))
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names, strings


INDEX_SAMPLE = """\
import os.path as p, torch.cuda
from torch.backends import cudnn as c
from . import sibling
@dec.orator(key=f"cuda:{i!r:>{w}}")
class K(Base, metaclass=M):
    async def m(self, *a, kw="x" * 3, **k):
        async with ctx() as (u, v):
            return [await y.attr async for y in z if (w := "nccl")]
match cmd:
    case Point(x=0, y=[1, *rest]) | {"k": v}:
        pass
lam = lambda q=torch.device("cuda"): q.is_cuda
global_name = b"bytes" + "%s" % "x" * 300
"""


@given(hypothesmith.from_grammar(auto_target=False))
@example(INDEX_SAMPLE)
@example("importA\u00b7 = ｃｏｓ\n")
def test_ast_index_finds_what_a_plain_walk_finds(source):
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    index = AstIndex.of(tree)
    assert (index.names, index.strings) == _index_by_ast_walk(tree)
    # The words of the text, looked at before the parse, hold every ASCII name the parse finds (what the
    # checkers look up is ASCII; `importA·` is one identifier to Python, `importA` and `·` to `\w+`).
    # `from m import *` indexes the `*` of its alias, which is no word.
    assert {name for name in index.names if name.isascii() and name != "*"} <= text_words(source)


def test_words_count_identifiers_as_python_reads_them():
    # Fullwidth letters spell `sin` and `cos` to Python; a ligature spells `fi`.
    source = "import torch\ndef rope(x, ｃｏｓ, ｓｉｎ):\n    return x * ｃｏｓ + x * ｓｉｎ\nﬁ = 1\n"
    assert AstIndex.of(ast.parse(source)).names <= text_words(source)
    assert {"cos", "sin", "fi"} <= text_words(source)
    assert FusedOpsChecker.wants_words(text_words(source))


def test_name_sets_keep_only_the_smallest():
    sets = name_sets(["torch.backends.cudnn", "torch.backends.cudnn.benchmark", "torch.nn.attention.sdpa_kernel"])
    assert sorted(sorted(s) for s in sets) == [
        ["attention", "nn", "sdpa_kernel", "torch"],
        ["backends", "cudnn", "torch"],
    ]


# -- what the prefilters used to drop although the checker reports it ------------------------------------


@pytest.mark.parametrize(
    "source, rules",
    [
        # a variable passed as a keyword, not a string
        ('import os\nos.environ.update(CUDA_VISIBLE_DEVICES="0,1")\n', ["NPU601"]),
        ('import os, subprocess\nsubprocess.run(cmd, env=dict(os.environ, NCCL_DEBUG="INFO"))\n', ["NPU603"]),
        # the Ascend name itself, with devices out of order
        ('import os\nos.environ["ASCEND_RT_VISIBLE_DEVICES"] = "3,1"\n', ["NPU604"]),
        # `env = {...}` with spaces, so no "env=" in the text
        ('import subprocess\nsubprocess.run(cmd, env = {"CUDA_VISIBLE_DEVICES": "0"})\n', ["NPU601"]),
        # backends that cannot be followed, with no "nccl" anywhere
        ("import torch.distributed as dist\nok = dist.is_backend_available(name)\n", ["NPU307"]),
        ("import torch.distributed as dist\nb = dist.Backend(name)\n", ["NPU307"]),
        ("from torch.nn.parallel import data_parallel\ny = data_parallel(model, x)\n", ["NPU305"]),
    ],
)
def test_sites_the_prefilters_used_to_miss(source, rules):
    migrated, findings = _run(source, select=[rules[0][:4]])
    assert [f[2] for f in findings] == rules
    assert_prefilter_changes_nothing(source)


# -- what they skip ------------------------------------------------------------------------------------


def _wants(checker, source: str) -> bool:
    return (
        any(m in source for m in checker.markers)
        and checker.wants_words(text_words(source))
        and checker.wants(AstIndex.of(ast.parse(source)))
    )


@pytest.mark.parametrize(
    "checker, skipped, kept",
    [
        (
            BackendsChecker,
            "import torch\nok = torch.backends.mps.is_available()\n@requires(backends=('torch',))\nclass M: ...\n",
            "import torch\ntorch.backends.cudnn.benchmark = True\n",
        ),
        (
            BackendsChecker,
            "import torch\nok = torch.backends.mps.is_available()\n",
            "from torch.backends import cudnn as c\nc.benchmark = True\n",
        ),
        (CudaApiChecker, "def f(args):\n    return args.cuda\n", "from torch import cuda\ncuda.synchronize()\n"),
        (
            DeviceChecker,
            'raise RuntimeError("CUDA out of memory on cuda:0")\nflag = "use_cuda_graph"\n',
            'x = t.to(f"cuda:{rank}")\n',
        ),
        (
            AmpChecker,
            "import torch\nif torch.is_autocast_enabled():\n    dtype = torch.get_autocast_dtype(device_type)\n",
            'import torch\ndtype = torch.get_autocast_dtype("cuda")\n',
        ),
        (AmpChecker, "example = clamp(x)\n", "import torch.cuda.amp as A\n"),
        (
            DistributedChecker,
            'import torch\nmsg = "the nccl backend"\nreport(device_ids)\n',
            'backend = "cpu:gloo,cuda:nccl"\n',
        ),
        (
            EnvironmentChecker,
            'import os\nhome = os.environ["HF_HOME"]\nlog("set CUDA_VISIBLE_DEVICES")\n',
            'import os\nos.environ.pop("NCCL_IB_HCA")\n',
        ),
        # `re.compile` in a file that imports torch is no torch.compile (#26); an alias of torch is.
        (StartupChecker, 'import re\nimport torch\nP = re.compile("x")\n', "import torch as t\nm = t.compile(model)\n"),
        (StartupChecker, "import torch.nn as nn\nf = nn.compile\n", "from torch import compile as c\nm = c(model)\n"),
        # an autograd Function's `def backward` is no backward pass in a loop; `.backward()` is.
        (
            DataPipelineChecker,
            "import torch\nclass F(torch.autograd.Function):\n    @staticmethod\n    def backward(ctx, g):\n        return g\n",
            "for batch in data:\n    loss = model(batch)\n    loss.backward()\n",
        ),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_mentions_are_skipped_uses_are_not(checker, skipped, kept):
    assert not _wants(checker, skipped)
    assert _wants(checker, kept)


@pytest.mark.parametrize(
    "checker, source",
    [
        # transformers' image processors: "Backend" is only part of a name
        (DistributedChecker, "from .image_processing_backends import TorchvisionBackend\nbase = TorchvisionBackend\n"),
        (EnvironmentChecker, '"""Set up the environment."""\nenvelope = make_envelope()\n'),
        (BackendsChecker, "import torch\n@requires(backends=('torch',))\nclass M:\n    use_cuda_graph = True\n"),
        (AmpChecker, "import torch\nif torch.cuda.is_available():\n    x = x.half()\n"),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_the_words_rule_out_before_the_ast(checker, source):
    assert any(m in source for m in checker.markers)
    assert not checker.wants_words(text_words(source))


def assert_words_never_stricter_than_the_ast(source: str) -> None:
    """`wants_words` runs first: where `wants` would keep a file, it must keep it too."""
    words, index = text_words(source), AstIndex.of(ast.parse(source))
    for checker in FILTERED:
        if checker.wants(index):
            assert checker.wants_words(words), checker.__name__


# -- the prefilters never change a result ----------------------------------------------------------------

PY_FIXTURES = sorted([*(FIXTURES / "rules").glob("*/*.in.py"), *(FIXTURES / "projects").rglob("*.py")], key=str)


@pytest.mark.parametrize("path", PY_FIXTURES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fixtures_come_out_the_same_without_prefilters(path):
    source = path.read_text(encoding="utf-8")
    assert_words_never_stricter_than_the_ast(source)
    assert_prefilter_changes_nothing(source)


# Sites and near misses of every family, to be combined at random.
SNIPPETS = [
    "x = torch.ones(2).cuda()",
    "y = x.is_cuda",
    "dev = torch.device('cuda:1')",
    "z = x.to(f'cuda:{rank}')",
    "w = x.to('cuda:{}'.format(i))",
    "msg = 'CUDA out of memory on cuda:0'",
    "flag = 'cuda'",
    "torch.cuda.synchronize()",
    "v = torch.version.cuda",
    "from torch import cuda as tc",
    "ok = tc.is_available()",
    "with torch.autocast('cuda'):\n    pass",
    "with torch.autocast(device_type):\n    pass",
    "d = torch.get_autocast_gpu_dtype()",
    "s = torch.cuda.amp.GradScaler()",
    "from torch.cuda.amp import autocast",
    "torch.backends.cudnn.benchmark = True",
    "torch.backends.cuda.matmul.allow_tf32 = True",
    "ok = torch.backends.mps.is_available()",
    "from torch.backends import cudnn",
    "cudnn.deterministic = True",
    "from torch.nn.attention import sdpa_kernel",
    "acts = [torch.profiler.ProfilerActivity.CUDA]",
    "dist.init_process_group(backend='nccl')",
    "dist.init_process_group(backend=cfg.backend)",
    "b = dist.Backend(name)",
    "if dist.get_backend() == 'nccl':\n    pass",
    "mesh = init_device_mesh('cuda', (2,))",
    "m = torch.nn.DataParallel(m)",
    "m = DDP(m, device_ids=['cuda:0'])",
    "os.environ['CUDA_VISIBLE_DEVICES'] = '1,0'",
    "os.environ.update(NCCL_DEBUG='INFO')",
    "home = os.getenv('HF_HOME')",
    "subprocess.run(cmd, env = {'TORCH_NCCL_BLOCKING_WAIT': '1'})",
    "@requires(backends=('torch',))\nclass Model:\n    pass",
    "cuda = make()",
]
HEADERS = [
    "import torch\n",
    "import os\nimport subprocess\nimport torch\nimport torch.distributed as dist\n",
    "import torch as th\nfrom torch.distributed.device_mesh import init_device_mesh\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n",
    "",
]


@given(st.sampled_from(HEADERS), st.lists(st.sampled_from(SNIPPETS), min_size=1, max_size=8))
def test_random_programs_come_out_the_same_without_prefilters(header, body):
    source = header + "\n".join(body) + "\n"
    assert_words_never_stricter_than_the_ast(source)
    assert_prefilter_changes_nothing(source)


@given(hypothesmith.from_grammar(auto_target=False))
@example(INDEX_SAMPLE)
def test_fused_matchers_walk_the_nodes_ast_walk_would(source):
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    assert nodes_of(tree) == list(ast.walk(tree))


@pytest.mark.parametrize(
    "source",
    [
        'import re\nimport torch\nP = re.compile("x")\nm = torch.compile(model)\n',
        "import torch as t\n\n@t.compile\ndef f(x):\n    return x\n",
        "from torch import *\nm = compile(model)\n",
        "import torch\nclass F(torch.autograd.Function):\n    def backward(ctx, g):\n        return g\n"
        "for batch in data:\n    loss = model(batch.cuda())\n    loss.backward()\n    print(loss.item())\n",
    ],
)
def test_the_training_lever_screens_drop_nothing(source):
    assert_prefilter_changes_nothing(source)
