"""Issue #14: the fused rewrites on third-party model code installed from PyPI, outside transformers.

x-transformers and rotary-embedding-torch (pinned in the `integration` extra) are read where pip
installed them, never copied. `analyze --mode affinity_apis` over both packages lists every fused-op
site with its status, and the recall by op is printed. Their rotary functions (an einops interleaved
`rotate_half`, angle tables times a scale, a partial rotary with a tail, and rotary-embedding-torch's
left part) are migrated with the engine and run against the installed originals on the packages' own
tables: with `_is_npu` false the bits are the original's; forced through verify's CPU reference kernels,
fp32 cosine >= 0.999 and bf16 >= 0.99, and a deliberately broken rewrite must fail that check. Last, a tiny
x-transformers `TransformerWrapper` with rotary embeddings is built from the original and the migrated
module and compared end to end.

The same spellings in our own fixtures (`fixtures/rules/NPU703/einops_*`, `every_other_pairs`,
`control_flow`) are run the same way, each with a broken rewrite of its own.

Only NPU703 is applied for the runs: the device rules (`import torch_npu`, autocast on "npu") need an
NPU host; the site counts come from every rule.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import itertools
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES
from test_fused_spellings import TORCH_NPU, _compare, _cosine, _perturb, _sites

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.transforms.fused.symbolic import has_fused_branch

pytestmark = pytest.mark.integration  # needs torch, x-transformers, rotary-embedding-torch: the `integration` extra

PACKAGES = ("x_transformers", "rotary_embedding_torch")
#: Fused-op sites of both packages by op and status, every rule of `analyze --mode affinity_apis`.
EXPECTED_SITES = {
    ("torch_npu.npu_rotary_mul", "applied"): 2,
    ("torch_npu.npu_rotary_mul", "declined"): 2,
    # x-transformers' SDPA call: left to torch_npu's native fused dispatch (NPU704), not wrapped.
    ("torch_npu.npu_fusion_attention", "native"): 1,
    # x-transformers' hand-written attention, and rotary-embedding-torch's two reference attentions, which
    # hold its declined rotary embeddings: each function is reported for both ops. (`TransformerWrapper.forward`,
    # whose softmax and matmuls are sampling and logits, not attention, is no longer one.)
    ("torch_npu.npu_fusion_attention", "declined"): 3,
    # x-transformers' F.normalize norms (ScaleNorm, RMSNorm, SimpleRMSNorm, and AdaptiveRMSNorm's through a
    # name since #23's recall work): F.normalize's clamped eps is not npu_rms_norm's.
    ("torch_npu.npu_rms_norm", "declined"): 4,
    # x-transformers' `nn.RMSNorm(...)` constructions (NPU706).
    ("torch_npu.npu_rms_norm", "applied"): 4,
    ("torch_npu.npu_scaled_masked_softmax", "candidate"): 1,
    # x-transformers' GLU: `self.act` bound to a constructor argument, checked `_is_silu` at run time; the
    # halves joined, as a softclamp may rebind `up` in between (#23).
    ("torch_npu.npu_swiglu", "applied"): 1,
}
#: The rotary sites, by file: its status and what its finding must say.
EXPECTED_ROTARY = {
    "x_transformers/x_transformers.py": ("applied", "interleaved rotary embedding gets a fused"),
    "rotary_embedding_torch/rotary_embedding_torch.py": ("applied", "interleaved rotary embedding gets a fused"),
    # The rotation sits under `if exists(cos) and exists(sin):`, with the attention after it.
    "rotary_embedding_torch/flash_fused_rotary.py": ("declined", "not straight-line"),
    # `rotate_half` is imported from the package's other module, which is read (#23): what declines is the
    # reference attention's own body (the rotation under an `if`, the attention after it).
    "rotary_embedding_torch/flash_attn_with_rotary.py": ("declined", "not straight-line"),
}
#: The migrated rotary modules, and the one function each gets a branch in.
MODULES = {
    "x_transformers.x_transformers": "apply_rotary_pos_emb",
    "rotary_embedding_torch.rotary_embedding_torch": "apply_rotary_emb",
}
#: What the broken rewrite changes: the pairs rotated as halves.
MUTANT = ('rotary_mode="interleave"', 'rotary_mode="half"')


def _package_dir(name: str) -> Path:
    return Path(importlib.util.find_spec(name).submodule_search_locations[0])


@pytest.fixture(scope="module")
def analysis() -> list[dict]:
    folders = [str(_package_dir(name)) for name in PACKAGES]
    command = [sys.executable, "-m", "npu_migrate", "analyze", "--mode", "affinity_apis", "--format", "json"]
    # The packages live in a virtualenv, which git usually ignores.
    done = subprocess.run([*command, "--no-gitignore", *folders], capture_output=True, text=True, check=False)
    assert done.stdout, done.stderr
    return _sites(json.loads(done.stdout))


def test_every_site_is_listed_and_the_recall_by_op_printed(analysis):
    counts: dict[tuple[str, str], int] = {}
    for site in analysis:
        key = (site["affinity_api"], site["status"])
        counts[key] = counts.get(key, 0) + 1
    print("third-party affinity sites:", {f"{op} {status}": n for (op, status), n in sorted(counts.items())})
    for op in sorted({op for op, _ in counts}):
        applied = counts.get((op, "applied"), 0)
        total = sum(n for (o, _), n in counts.items() if o == op)
        print(f"  {op}: {applied} of {total} applied")
    assert counts == EXPECTED_SITES


def test_each_rotary_site_is_applied_or_declined_with_its_reason(analysis):
    rotary = {}
    for site in analysis:
        if site["affinity_api"] == "torch_npu.npu_rotary_mul":
            path = site["location"].rsplit(":", 2)[0]
            assert path not in rotary, f"one finding per function: {path} has two"
            rotary[path] = (site["status"], site["reason"])
    assert set(rotary) == set(EXPECTED_ROTARY)
    for path, (status, reason) in EXPECTED_ROTARY.items():
        assert rotary[path][0] == status and reason in rotary[path][1], (path, rotary[path])


def _multiplies_a_rotation(function: ast.FunctionDef) -> bool:
    """Whether the function's own body (nested defs aside) multiplies what a `rotate*` function returns, and
    the function reads cos and sin tables (`rotate_image(img) * mask` is no rotary embedding)."""
    words = [a.arg for a in function.args.args] + [
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(function)
        if isinstance(n, (ast.Name, ast.Attribute))
    ]
    if not (any("cos" in w for w in words) and any("sin" in w for w in words)):
        return False
    pending = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for factor in (node.left, node.right):
                func = factor.func if isinstance(factor, ast.Call) else None
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if "rotate" in name.lower():
                    return True
        pending.extend(ast.iter_child_nodes(node))
    return False


def _rotary_files() -> list[Path]:
    installed = [path for name in PACKAGES for path in sorted(_package_dir(name).rglob("*.py"))]
    return installed + sorted((FIXTURES / "rules" / "NPU703").glob("*.in.py"))


def test_no_rotary_embedding_is_left_in_silence():
    """The matcher's rule: a function that multiplies a `rotate_half`-like helper's result (by its cos/sin
    tables) gets an NPU703 finding, a branch or the reason it has none, in the packages and our fixtures."""
    silent = []
    for path in _rotary_files():
        source = path.read_text(encoding="utf-8")
        _, found = migrate_text(source, path=path.name.replace(".in.", "."), select=["NPU703"])
        reported = {f.line for f in found}
        for node in ast.walk(ast.parse(source)):
            defs = (ast.FunctionDef, ast.AsyncFunctionDef)
            # A function that already holds its fused branch (a second run) is done with.
            if isinstance(node, defs) and _multiplies_a_rotation(node) and not has_fused_branch(node):
                # A finding is reported at the def, or at its first decorator.
                lines = {node.lineno, *(d.lineno for d in node.decorator_list)}
                if not lines & reported:
                    silent.append(f"{path.name}:{node.lineno} {node.name}")
    assert silent == []


@pytest.fixture(scope="module")
def migrated() -> dict[str, tuple[Path, str, str]]:
    """Module -> (its installed file, the original text, the text migrated by NPU703)."""
    found = {}
    for module in MODULES:
        path = Path(importlib.util.find_spec(module).origin)
        source = path.read_text(encoding="utf-8")
        text, _ = migrate_text(source, path=path.name, select=["NPU703"])
        found[module] = (path, source, text)
    return found


@pytest.mark.parametrize("module", MODULES)
def test_the_rotary_function_gets_one_branch_and_the_original_stays(migrated, module):
    import difflib

    path, source, text = migrated[module]
    branch_of = text.split(f"def {MODULES[module]}(", 1)[1].split("\ndef ", 1)[0]
    assert branch_of.count("if _is_npu(t):") == 1
    assert text.count("_npu_rotary_mul(") - text.count("def _npu_rotary_mul(") == 1
    removed = [line for line in difflib.ndiff(source.splitlines(), text.splitlines()) if line.startswith("- ")]
    assert removed == []  # the branch and the helpers are insertions only
    again, refound = migrate_text(text, path=path.name, select=["NPU703"])
    assert again == text and not any(f.fixed for f in refound)


_LOADED = itertools.count()


def _namespace(migrated, module: str, *, forced: bool, mutate: tuple[str, str] | None = None) -> dict:
    """The migrated module executed as a module of its package (its imports resolve to the installed
    package), with `_is_npu` true and the CPU reference kernels as `torch_npu` when `forced`."""
    path, _, text = migrated[module]
    if mutate is not None:
        assert mutate[0] in text, f"mutant {mutate[0]!r} does not apply to {path.name}"
        text = text.replace(*mutate)
    # A module of its own, registered: dataclasses look their module up while the class is made.
    loaded = types.ModuleType(f"{module}_migrated_{next(_LOADED)}")
    loaded.__package__, loaded.__file__ = module.rsplit(".", 1)[0], str(path)
    sys.modules[loaded.__name__] = loaded
    namespace = vars(loaded)
    exec(compile(text, str(path), "exec"), namespace)
    if forced:
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    return namespace


def _heads(dtype, generator_seed=2, dim=24):
    """q-like (B, N, S, D) = (2, 3, 5, dim), large: a wrong rotation shows in the cosine."""
    return (3 * torch.randn(2, 3, 5, dim, generator=torch.Generator().manual_seed(generator_seed))).to(dtype)


def _x_transformers_call(xpos: bool):
    """x-transformers' own tables: `RotaryEmbedding(16)` for 5 positions, (1, 5, 16), with its xpos scale
    (a tensor) or none (the number 1.0); 16 of each head's 24 features rotated, the rest passed through."""

    def call(namespace, dtype):
        from x_transformers.x_transformers import RotaryEmbedding

        freqs, scale = RotaryEmbedding(16, use_xpos=xpos, scale_base=4).forward_from_seq_len(5)
        scale = scale.to(dtype) if torch.is_tensor(scale) else scale
        return namespace["apply_rotary_pos_emb"](_heads(dtype), freqs.to(dtype), scale)

    return call


def _rotary_embedding_torch_call(namespace, dtype):
    """rotary-embedding-torch's own tables (`RotaryEmbedding(8)` for 5 positions), as (1, 1, S, 8), rotating
    features 4 to 12 of 24: a left part and a tail pass through."""
    from rotary_embedding_torch import RotaryEmbedding

    rotary = RotaryEmbedding(8)
    freqs = rotary(rotary.get_seq_pos(5, dtype=torch.float32))[None, None]
    return namespace["apply_rotary_emb"](freqs.to(dtype), _heads(dtype), start_index=4, scale=1.0)


def _original(module: str) -> dict:
    return vars(importlib.import_module(module))


# (module, call)
CASES = {
    "x_transformers": ("x_transformers.x_transformers", _x_transformers_call(xpos=False)),
    "x_transformers_xpos": ("x_transformers.x_transformers", _x_transformers_call(xpos=True)),
    "rotary_embedding_torch_left_part": ("rotary_embedding_torch.rotary_embedding_torch", _rotary_embedding_torch_call),
}


def _compare_installed(migrated, name, dtype, mutate=None):
    """(cosine of the forced migrated function vs the installed one, kernel calls, fallback bit-identical)."""
    module, call = CASES[name]
    expected = call(_original(module), dtype)
    before = TORCH_NPU.calls["npu_rotary_mul"]
    got = call(_namespace(migrated, module, forced=True, mutate=mutate), dtype)
    calls = TORCH_NPU.calls["npu_rotary_mul"] - before
    kept = call(_namespace(migrated, module, forced=False), dtype)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    return _cosine(got, expected), calls, torch.equal(kept, expected)


@pytest.mark.parametrize("dtype, floor", [(torch.float32, 0.999), (torch.bfloat16, 0.99)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", CASES)
def test_installed_rotary_agrees_with_its_migration(migrated, name, dtype, floor):
    cosine, calls, fallback_identical = _compare_installed(migrated, name, dtype)
    assert calls == 1, "the fused kernel must run on the package's own tables"
    assert cosine >= floor
    assert fallback_identical


@pytest.mark.parametrize("name", CASES)
def test_a_broken_rewrite_is_caught(migrated, name):
    cosine, calls, _ = _compare_installed(migrated, name, torch.float32, mutate=MUTANT)
    assert calls == 1
    assert cosine < 0.999


def test_two_dimensional_tables_run_the_original_code(migrated):
    """rotary-embedding-torch's `rotate_queries_or_keys` passes (S, D) tables: the kernel takes 4-D ones
    only, so the guard keeps the original code, bit for bit."""
    from rotary_embedding_torch import RotaryEmbedding

    module = "rotary_embedding_torch.rotary_embedding_torch"
    forced = _namespace(migrated, module, forced=True)
    q = _heads(torch.float32, dim=16)
    rotary = RotaryEmbedding(8)
    expected = rotary.rotate_queries_or_keys(q)
    rotary.apply_rotary_emb = staticmethod(forced["apply_rotary_emb"])
    before = TORCH_NPU.calls["npu_rotary_mul"]
    assert torch.equal(rotary.rotate_queries_or_keys(q), expected)
    assert TORCH_NPU.calls["npu_rotary_mul"] == before


# -- a tiny x-transformers model, end to end -------------------------------------------------------------

DEPTH = 2


def _model_logits(namespace, dtype, tokens):
    torch.manual_seed(0)
    model = namespace["TransformerWrapper"](
        num_tokens=64,
        max_seq_len=16,
        attn_layers=namespace["Decoder"](dim=32, depth=DEPTH, heads=2, attn_dim_head=32, rotary_pos_emb=True),
    )
    _perturb(model, torch.Generator().manual_seed(1)).to(dtype).eval()
    with torch.no_grad():
        return model(tokens).float()


@pytest.mark.parametrize("dtype, floor", [(torch.float32, 0.999), (torch.bfloat16, 0.99)], ids=["fp32", "bf16"])
def test_transformer_wrapper_with_rotary_end_to_end(migrated, dtype, floor):
    module = "x_transformers.x_transformers"
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    expected = _model_logits(_original(module), dtype, tokens)
    before = TORCH_NPU.calls["npu_rotary_mul"]
    got = _model_logits(_namespace(migrated, module, forced=True), dtype, tokens)
    assert TORCH_NPU.calls["npu_rotary_mul"] - before == 2 * DEPTH  # q and k per layer
    assert _cosine(got, expected) >= floor
    assert torch.equal(_model_logits(_namespace(migrated, module, forced=False), dtype, tokens), expected)


# -- the same spellings in our own fixtures ----------------------------------------------------------------


def _bsnd(x):
    """(2, 5, 2, 16) from the (2, 5, 16) input: batch, sequence, heads, head dim."""
    return x.reshape(2, 5, 2, 8).repeat(1, 1, 1, 2) * 3


def _angles(width, dtype):
    """(1, S, 1, width) angles, each feature its own frequency: 1S1D against BSND tensors."""
    return (torch.arange(5).float()[None, :, None, None] * torch.linspace(0.1, 1.5, width)).to(dtype)


def _xpos_scale(width, dtype):
    return torch.linspace(0.6, 1.4, 5 * width).reshape(1, 5, 1, width).to(dtype)


def _fixture(name):
    return lambda namespace: namespace[name]


# (case, build, call, mutant of the generated code that must be caught)
FIXTURE_CASES = {
    "scaled_number_with_tail": (
        "einops_interleaved",
        _fixture("rotate_scaled"),
        lambda fn, x: fn(_bsnd(x), _angles(8, x.dtype), 0.5),
        MUTANT,
    ),
    "scaled_tensor_with_tail": (
        "einops_interleaved",
        _fixture("rotate_scaled"),
        lambda fn, x: fn(_bsnd(x), _angles(8, x.dtype), _xpos_scale(8, x.dtype)),
        ("_npu_sin = angles.sin() * scale", "_npu_sin = angles.sin()"),
    ),
    "left_part_and_tail": (
        "einops_interleaved",
        _fixture("rotate_window"),
        lambda fn, x: fn(_angles(8, x.dtype), _bsnd(x), offset=4, scale=1.0),
        ("_npu_x0 = t[..., offset:_npu_w]", "_npu_x0 = t[..., :angles.shape[-1]]"),
    ),
    "after_an_if": (
        "einops_conditional",
        _fixture("rotate_batched"),
        # (1, S, D) angles get their head axis under the `if`: 11SD against BNSD tensors.
        lambda fn, x: fn(_bsnd(x).transpose(1, 2), _angles(16, x.dtype)[:, :, 0], 2.0),
        MUTANT,
    ),
    "leading_axis_halves": (
        "einops_leading_axis",
        _fixture("rotate"),
        lambda fn, x: fn(_bsnd(x), _angles(16, x.dtype), 0.7),
        ("_npu_sin = freqs.sin() * scale", "_npu_sin = -freqs.sin() * scale"),
    ),
    "every_other": (
        "every_other_pairs",
        _fixture("apply_every_other"),
        lambda fn, x: fn(_bsnd(x), _angles(16, x.dtype).cos(), _angles(16, x.dtype).sin()),
        MUTANT,
    ),
    "viewed_pairs_of_an_upcast": (
        "every_other_pairs",
        _fixture("apply_upcast_pairs"),
        lambda fn, x: fn(_bsnd(x), _angles(16, torch.float32).cos(), _angles(16, torch.float32).sin()),
        MUTANT,
    ),
    "old_hf_position_ids": (
        "control_flow",
        _fixture("apply_rotary_pos_emb"),
        # (S, D) tables indexed by position ids under an `if`, then unsqueezed: B1SD against BNSD.
        lambda fn, x: torch.cat(
            fn(
                _bsnd(x).transpose(1, 2),
                _bsnd(x).transpose(1, 2).flip(-1),
                _angles(16, x.dtype)[0, :, 0].cos(),
                _angles(16, x.dtype)[0, :, 0].sin(),
                torch.arange(5).flip(0).repeat(2, 1),
            )
        ),
        ("_npu_rotary_mul(k, _npu_cos", "_npu_rotary_mul(k.flip(-1), _npu_cos"),
    ),
}
#: Cases whose function runs the kernel more than once (q and k).
FIXTURE_KERNEL_CALLS = {"old_hf_position_ids": 2}


@pytest.mark.parametrize("dtype, floor", [(torch.float32, 0.999), (torch.bfloat16, 0.99)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", FIXTURE_CASES)
def test_fixture_branch_agrees_with_the_original(name, dtype, floor):
    case, build, call, _ = FIXTURE_CASES[name]
    cosine, calls, fallback_identical = _compare(case, "NPU703", build, call, dtype)
    assert calls == FIXTURE_KERNEL_CALLS.get(name, 1)
    assert cosine >= floor
    assert fallback_identical


@pytest.mark.parametrize("name", FIXTURE_CASES)
def test_a_broken_fixture_rewrite_is_caught(name):
    case, build, call, mutant = FIXTURE_CASES[name]
    cosine, calls, _ = _compare(case, "NPU703", build, call, torch.float32, mutate=mutant)
    assert calls == FIXTURE_KERNEL_CALLS.get(name, 1)
    assert cosine < 0.999
