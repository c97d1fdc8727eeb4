"""`npu-migrate verify` end to end: real HF models, hand-written attention/rotary rewrites, broken rewrites.

Each `compare()` starts two fresh interpreters (original and migrated tree), so the tests batch work:
all six HF models are one `nn.Module` per run, and one run checks several broken rewrites at once (each
model's output must fail or pass on its own).

The factories use weights large enough for mistakes to show. With HF's default init (std 0.02) SiLU is
nearly linear, so a SwiGLU that activates the wrong half still scores cosine 0.9993 on these models;
with std 0.2 (about 1.6x the Xavier scale for width 64) and norm weights 1 + 0.5·randn it scores 0.59,
while the correct rewrite scores 1.0 in float32 and >= 0.9995 in bfloat16.
"""

from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.engine.templating import render
from npu_migrate.verify import VerifyUsageError, compare
from npu_migrate.verify.cli import verify_command

pytestmark = pytest.mark.integration  # needs torch (and transformers): the `integration` extra

MODELS = (
    ("llama", "Llama"),
    ("qwen2", "Qwen2"),
    ("qwen3", "Qwen3"),
    ("mistral", "Mistral"),
    ("gemma", "Gemma"),
    ("phi3", "Phi3"),
)
LAYERS = 2
#: Forward passes per model per run: unpadded and right-padded.
FORWARDS = 2
FP32_BAR = 0.999
#: bfloat16: the fused kernels round once where the originals round after each op; measured >= 0.9995
#: on these models (see the module docstring), pinned with some headroom.
BF16_BAR = 0.998
#: Gemma's MLP is GELU: `_is_silu` declines its SwiGLU branch at run time, by design.
DECLINED = {("gemma", "npu_swiglu")}
SDPA_MODULE = "transformers.integrations.sdpa_attention"

HF_FACTORY = textwrap.dedent(f'''
    import torch
    import transformers

    MODELS = {MODELS!r}


    class Zoo(torch.nn.Module):
        """All six models in one module: one worker process per side instead of six."""

        def __init__(self, models):
            super().__init__()
            self.models = torch.nn.ModuleDict(models)

        def forward(self, input_ids, attention_mask):
            # Unpadded, HF's SDPA path passes is_causal; right-padded, a bool mask (NPU707's two paths).
            out = {{}}
            for name, m in self.models.items():
                out[f"{{name}}.logits"] = m(input_ids=input_ids, use_cache=False).logits
                out[f"{{name}}.padded.logits"] = m(
                    input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
            return out


    def build():
        models = {{}}
        for name, prefix in MODELS:
            config = getattr(transformers, prefix + "Config")(
                hidden_size=64, intermediate_size=128, num_hidden_layers={LAYERS}, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=128, pad_token_id=0, initializer_range=0.2,
            )
            config._attn_implementation = "sdpa"
            model = getattr(transformers, prefix + "ForCausalLM")(config)
            with torch.no_grad():
                for module in model.modules():
                    if type(module).__name__.endswith("RMSNorm"):
                        noise = 0.5 * torch.randn_like(module.weight)
                        # Gemma stores w and scales by 1 + w; the others scale by w.
                        module.weight.copy_(noise if name == "gemma" else 1 + noise)
            models[name] = model
        attention_mask = torch.ones(2, 12, dtype=torch.long)
        attention_mask[1, 8:] = 0
        return Zoo(models), {{"input_ids": torch.randint(0, 128, (2, 12)), "attention_mask": attention_mask}}
''')


def _package_root() -> Path:
    return Path(importlib.util.find_spec("transformers").submodule_search_locations[0])


#: The files `npu-migrate apply` rewrites for these models: the six modeling files, and HF's SDPA
#: attention function, which every model calls with attn_implementation="sdpa": wrapped by the opt-in
#: NPU707 (by default NPU704 leaves it to torch_npu's native dispatch), so that its kernel path is checked.
MIGRATED_FILES = [f"models/{name}/modeling_{name}.py" for name, _ in MODELS] + ["integrations/sdpa_attention.py"]


def _migrated_transformers(site: Path, edits: dict[str, list[tuple[str, str]]] | None = None) -> None:
    """A transformers package under `site` with MIGRATED_FILES migrated and symlinks for the rest;
    `edits` maps a model name (or "sdpa") to (regex, replacement) pairs applied to the migrated text."""
    original = _package_root()
    folders = {Path(f).parent for f in MIGRATED_FILES}
    folders |= {parent for folder in folders for parent in folder.parents}

    def mirror(rel: Path) -> None:
        (site / "transformers" / rel).mkdir(parents=True)
        for entry in (original / rel).iterdir():
            target = rel / entry.name
            if entry.name == "__pycache__" or target in folders or str(target) in MIGRATED_FILES:
                continue
            (site / "transformers" / target).symlink_to(entry)

    for folder in sorted(folders):
        mirror(folder)
    for rel in MIGRATED_FILES:
        source = (original / rel).read_text(encoding="utf-8")
        key = "sdpa" if rel.startswith("integrations") else Path(rel).parent.name
        text, _ = migrate_text(source, path=Path(rel).name, select=["ALL", "NPU707"] if key == "sdpa" else None)
        for pattern, replacement in (edits or {}).get(key, []):
            text, n = re.subn(pattern, replacement, text)
            assert n >= 1, f"the {key} edit {pattern!r} no longer matches the migrated code"
        (site / "transformers" / rel).write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    (root / "original").mkdir()
    (root / "original" / "transformers").symlink_to(_package_root())
    _migrated_transformers(root / "migrated")
    (root / "factory.py").write_text(HF_FACTORY, encoding="utf-8")
    return root


def _expected_calls(name: str) -> dict[str, int]:
    """Kernel calls the rewrite must make per forward: two norms per layer plus the final one (Qwen3
    adds q/k norms per layer), one SwiGLU per layer (none for Gemma), rotary on q and k per layer."""
    per_forward = {
        "npu_rms_norm": 2 * LAYERS + 1 + (2 * LAYERS if name == "qwen3" else 0),
        "npu_swiglu": 0 if name == "gemma" else LAYERS,
        "npu_rotary_mul": 2 * LAYERS,
    }
    return {op: FORWARDS * n for op, n in per_forward.items() if n}


def _module(report, name):
    return _module_named(report, f"transformers.models.{name}.modeling_{name}")


def _module_named(report, name):
    (module,) = [m for m in report.modules if m.name == name]
    return module


@pytest.mark.parametrize("dtype, bar", [("float32", FP32_BAR), ("bfloat16", BF16_BAR)])
def test_hf_models_agree_with_every_fused_branch_running(hf, dtype, bar):
    report = compare(hf / "original", hf / "migrated", hf / "factory.py", min_cosine=bar, dtype=dtype)
    assert report.passed, report.to_text(verbose=True)
    assert report.mode == "reference"
    assert [o.name for o in report.outputs] == [
        f"{name}{kind}.logits" for name, _ in MODELS for kind in ("", ".padded")
    ]
    for name, _ in MODELS:
        for kind in ("", ".padded"):
            out = report.output(f"{name}{kind}.logits")
            assert out.cosine >= bar and out.shape == [2, 12, 128], report.to_text()
        module = _module(report, name)
        assert module.calls == _expected_calls(name), (name, module.calls)
        # Every op the rewrite put in the file runs, bar the declined ones: a new fused rule that lands
        # in these files without running here fails this test.
        assert {op for op in module.sites if (name, op) not in DECLINED} == {
            op for op, n in module.calls.items() if n
        }, (name, module.sites, module.calls)
    # NPU707's kernel path takes fp16/bf16 only (its guard sends fp32 to SDPA); in bf16 it runs once per
    # layer and forward of every model.
    sdpa = _module_named(report, SDPA_MODULE)
    expected = 0 if dtype == "float32" else FORWARDS * LAYERS * len(MODELS)
    assert "npu_fusion_attention" in sdpa.sites and sdpa.calls.get("npu_fusion_attention", 0) == expected, sdpa.calls
    if dtype == "float32":
        assert all(o.max_rel_err < 1e-4 and o.top1 == 1.0 for o in report.outputs), report.to_text()


#: Rewrites broken by editing the migrated text: a model name (or "sdpa") -> (regex, replacement) pairs.
HF_BREAKS = {
    # SwiGLU activating the up projection instead of the gate.
    "llama": [
        (
            r"_npu_silu_mul\(self\.gate_proj\(x\), self\.up_proj\(x\)\)",
            "_npu_silu_mul(self.up_proj(x), self.gate_proj(x))",
        )
    ],
    # Gemma's RMSNorm scales by (1 + w): the kernel given w alone.
    "gemma": [(r"1\.0 \+ self\.weight\.float\(\)", "self.weight.float()")],
    # Rotary with cos and sin swapped.
    "qwen2": [(r"npu_rotary_mul\((\w+), (\w+), (\w+)\)", r"npu_rotary_mul(\1, \3, \2)")],
    # NPU707 without the mask inversion (SDPA: True = attend; the kernel: True = masked).
    "sdpa": [(r"torch\.logical_not\(expanded\)", "expanded")],
}


def test_broken_hf_rewrites_are_caught(hf, tmp_path):
    """One bf16 run (NPU707's kernel path is bf16/fp16 only), four rewrites broken at once; each shows
    up where it should and nowhere else: the three models' outputs, and every padded output (the
    unpadded forwards take the is_causal path, which has no mask to invert)."""
    _migrated_transformers(tmp_path / "migrated", HF_BREAKS)
    report = compare(hf / "original", tmp_path / "migrated", hf / "factory.py", min_cosine=BF16_BAR, dtype="bfloat16")
    assert not report.passed
    failed = {o.name for o in report.outputs if not o.passed}
    broken_models = {name for name in HF_BREAKS if name != "sdpa"}
    expected = {f"{name}.logits" for name in broken_models} | {f"{name}.padded.logits" for name, _ in MODELS}
    assert failed == expected, report.to_text()
    for name in failed:
        assert report.output(name).cosine < 0.9, report.to_text()
        assert any(f.startswith(f"{name}: cosine") for f in report.failures)


def test_npu707_without_its_scale_is_caught(hf, tmp_path):
    # The kernel's scale defaults to 1.0, SDPA's to 1/sqrt(D): every forward goes wrong.
    _migrated_transformers(
        tmp_path / "migrated", {"sdpa": [(r"atten_mask=mask,\n\s*scale=scale,", "atten_mask=mask,")]}
    )
    report = compare(hf / "original", tmp_path / "migrated", hf / "factory.py", min_cosine=BF16_BAR, dtype="bfloat16")
    assert not report.passed
    assert all(not o.passed and o.cosine < 0.99 for o in report.outputs), report.to_text()


# -- attention and rotary, hand-written rewrites ----------------------------------------------------------

SNIPPET = """
import math

import torch
import torch.nn.functional as F
from torch import nn


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q, k, cos, sin):
    {rotary_branch}return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def attention(q, k, v, attn_mask=None, is_causal=False):
    {attention_branch}return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=True)


class Block(nn.Module):
    def __init__(self, hidden=64, heads=4, kv_heads=2, head_dim=16):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x, attn_mask=None):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        emb = torch.outer(torch.arange(s, dtype=torch.float32), inv).repeat(1, 2)
        cos, sin = emb.cos()[None, None].to(x.dtype), emb.sin()[None, None].to(x.dtype)
        q, k = apply_rotary(q, k, cos, sin)
        out = attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(64, 32, bias=False)

    def forward(self, x, keep):
        s = x.shape[1]
        attend = torch.ones(s, s, dtype=torch.bool).tril()[None, None] & keep[:, None, None, :]  # True = attend
        return self.head(self.block(x)), self.head(self.block(x, attn_mask=attend))
"""

ROTARY_BRANCH = """if _is_npu(q):
        return torch_npu.npu_rotary_mul(q, cos, sin), torch_npu.npu_rotary_mul(k, cos, sin)
    """

ATTENTION_BRANCH = """if _is_npu(q) and (attn_mask is None or attn_mask.dtype == torch.bool):
        if is_causal:
            mask, mode = torch.ones(2048, 2048, dtype=torch.bool, device=q.device).triu(1), 2
        else:
            mask, mode = (None if attn_mask is None else ~attn_mask), 0
        return torch_npu.npu_fusion_attention(
            q, k, v, q.shape[1], "BNSD", atten_mask=mask, scale=1.0 / math.sqrt(q.shape[-1]), sparse_mode=mode
        )[0]
    """

SNIPPET_FACTORY = """
import torch

from attnlib import Model


def build():
    model = Model()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    keep = torch.ones(2, 10, dtype=torch.bool)
    keep[1, 7:] = False  # right padding: every query row still sees key 0
    return model, (torch.randn(2, 10, 64), keep)
"""


def _snippet(original: bool) -> str:
    text = SNIPPET.format(
        rotary_branch="" if original else ROTARY_BRANCH, attention_branch="" if original else ATTENTION_BRANCH
    )
    if original:
        return text
    # The prelude is the codemod's own, rendered from its template, after the imports.
    head, tail = text.split("\n\n\ndef rotate_half", 1)
    return f"{head}\n\n\n{render('fused/prelude.py.j2', import_torch_npu=True, torch_npu_imported=False).rstrip()}\n\n\ndef rotate_half{tail}"


@pytest.fixture(scope="module")
def snippet(tmp_path_factory):
    root = tmp_path_factory.mktemp("snippet")
    for side, original in (("original", True), ("migrated", False)):
        (root / side).mkdir()
        (root / side / "attnlib.py").write_text(_snippet(original), encoding="utf-8")
    (root / "factory.py").write_text(SNIPPET_FACTORY, encoding="utf-8")
    return root


def _variant(snippet: Path, tmp_path: Path, old: str, new: str) -> Path:
    text = (snippet / "migrated" / "attnlib.py").read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    (tmp_path / "attnlib.py").write_text(text.replace(old, new), encoding="utf-8")
    return tmp_path


def test_snippet_original_is_sdpa_and_migrated_compiles(snippet):
    text = (snippet / "migrated" / "attnlib.py").read_text(encoding="utf-8")
    compile(text, "attnlib.py", "exec")
    assert "def _is_npu(" in text
    assert "torch_npu" not in (snippet / "original" / "attnlib.py").read_text(encoding="utf-8")


@pytest.mark.parametrize("dtype, bar", [("float32", FP32_BAR), ("bfloat16", BF16_BAR)])
def test_hand_written_attention_and_rotary_rewrites_agree(snippet, dtype, bar):
    report = compare(snippet / "original", snippet / "migrated", snippet / "factory.py", min_cosine=bar, dtype=dtype)
    assert report.passed, report.to_text(verbose=True)
    assert [o.name for o in report.outputs] == ["output[0]", "output[1]"]
    assert all(o.cosine >= bar for o in report.outputs)
    # Two attention calls per forward (causal, padded), each rotating q and k.
    assert report.fused_calls == {"npu_fusion_attention": 2, "npu_rotary_mul": 4}
    assert [m.name for m in report.modules] == ["attnlib"]


BROKEN = {
    # SDPA's bool mask is True = attend; npu_fusion_attention's is True = masked. Only the padded call
    # passes a bool mask; the causal one uses the compressed mask and is unaffected. Inverted, some rows
    # are fully masked: NaN in the reference, since the device leaves them undefined...
    "inverted_mask": ([("else ~attn_mask", "else attn_mask")], {"padded"}),
    # ... and with inner_precise=2 (those rows defined as zero) the values alone give it away.
    "inverted_mask_precise": (
        [("else ~attn_mask", "else attn_mask"), ("sparse_mode=mode", "sparse_mode=mode, inner_precise=2")],
        {"padded"},
    ),
    # npu_fusion_attention's scale defaults to 1.0, not 1/sqrt(D).
    "missing_scale": ([(", scale=1.0 / math.sqrt(q.shape[-1])", "")], {"causal", "padded"}),
    "swapped_cos_sin": ([("npu_rotary_mul(q, cos, sin)", "npu_rotary_mul(q, sin, cos)")], {"causal", "padded"}),
    "interleave_for_half": (
        [("npu_rotary_mul(k, cos, sin)", 'npu_rotary_mul(k, cos, sin, "interleave")')],
        {"causal", "padded"},
    ),
    "control": ([], set()),
}

ZOO_FACTORY = f"""
import importlib

import torch

CASES = {sorted(BROKEN)!r}


class Zoo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.models = torch.nn.ModuleDict({{c: importlib.import_module(f"attn_{{c}}").Model() for c in CASES}})

    def forward(self, x, keep):
        out = {{}}
        for case, model in self.models.items():
            out[f"{{case}}.causal"], out[f"{{case}}.padded"] = model(x, keep)
        return out


def build():
    model = Zoo()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    keep = torch.ones(2, 10, dtype=torch.bool)
    keep[1, 7:] = False
    return model, (torch.randn(2, 10, 64), keep)
"""


def test_wrong_attention_and_rotary_rewrites_fail(snippet, tmp_path):
    """One run, one module per mistake (plus an unbroken control): each must fail on its own outputs."""
    original, migrated = _snippet(True), (snippet / "migrated" / "attnlib.py").read_text(encoding="utf-8")
    for side in ("original", "migrated"):
        (tmp_path / side).mkdir()
    for case, (edits, _) in BROKEN.items():
        text = migrated
        for old, new in edits:
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        (tmp_path / "original" / f"attn_{case}.py").write_text(original, encoding="utf-8")
        (tmp_path / "migrated" / f"attn_{case}.py").write_text(text, encoding="utf-8")
    (tmp_path / "factory.py").write_text(ZOO_FACTORY, encoding="utf-8")
    report = compare(tmp_path / "original", tmp_path / "migrated", tmp_path / "factory.py", min_cosine=FP32_BAR)
    assert not report.passed
    for case, (_, failing) in BROKEN.items():
        for call in ("causal", "padded"):
            out = report.output(f"{case}.{call}")
            assert out.passed == (call not in failing), report.to_text()
            if not out.passed:
                assert out.note or out.cosine < 0.99, report.to_text()
        module = _module_named(report, f"attn_{case}")
        assert module.calls == {"npu_fusion_attention": 2, "npu_rotary_mul": 4}
    assert report.output("inverted_mask_precise.padded").cosine < 0.99
    assert report.output("control.causal").cosine >= FP32_BAR


# Rewrites the device itself would reject: the reference raises like the kernel, and verify fails.
REJECTED = {
    "inverted-causal-mask": (".triu(1), 2", ".tril(), 2", "inverted"),
    "kv-heads-as-head_num": ('q, k, v, q.shape[1], "BNSD"', 'q, k, v, k.shape[1], "BNSD"', "does not match"),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_rewrites_the_device_rejects_fail(snippet, tmp_path, case):
    old, new, message = REJECTED[case]
    report = compare(snippet / "original", _variant(snippet, tmp_path, old, new), snippet / "factory.py")
    assert not report.passed and not report.outputs
    (failure,) = report.failures
    assert "the device rejects" in failure and message in failure and "attnlib.py:" in failure


def test_a_branch_that_never_runs_is_a_failure_not_a_pass(snippet, tmp_path):
    text = (
        (snippet / "migrated" / "attnlib.py")
        .read_text(encoding="utf-8")
        .replace("if _is_npu(q)", "if False and _is_npu(q)")
    )
    (tmp_path / "attnlib.py").write_text(text, encoding="utf-8")
    report = compare(snippet / "original", tmp_path, snippet / "factory.py")
    assert all(o.cosine > 0.999999 for o in report.outputs)  # numerically perfect: nothing was fused
    assert not report.passed
    assert any("none ran" in f and "silent fallback" in f for f in report.failures)


def test_trees_given_the_wrong_way_round_verify_nothing_and_fail(snippet):
    report = compare(snippet / "migrated", snippet / "original", snippet / "factory.py")
    assert not report.passed and not report.modules
    assert any("no migrated module with fused branches was imported" in f for f in report.failures)
    assert any("original tree already contains fused branches (in attnlib)" in w for w in report.warnings)


def test_a_migrated_tree_that_does_not_import_fails_the_check(snippet, tmp_path):
    migrated = _variant(snippet, tmp_path, "import math\n", "import math\nfrom torch import no_such_name\n")
    report = compare(snippet / "original", migrated, snippet / "factory.py")
    assert not report.passed
    (failure,) = report.failures
    assert "fails where the original runs" in failure and "ImportError" in failure and "attnlib.py:" in failure


# -- usage errors -----------------------------------------------------------------------------------------


def test_usage_errors(snippet, tmp_path):
    with pytest.raises(VerifyUsageError, match="--original .*not a directory"):
        compare(tmp_path / "nope", snippet / "migrated", snippet / "factory.py")
    with pytest.raises(VerifyUsageError, match="--factory .*no such file"):
        compare(snippet / "original", snippet / "migrated", tmp_path / "nope.py")
    with pytest.raises(VerifyUsageError, match="dtype"):
        compare(snippet / "original", snippet / "migrated", snippet / "factory.py", dtype="float64")
    with pytest.raises(VerifyUsageError, match="same directory"):
        compare(snippet / "original", snippet / "original", snippet / "factory.py")


def test_user_code_errors_name_the_file_and_line(snippet, tmp_path):
    (tmp_path / "nobuild.py").write_text("MODEL = None\n", encoding="utf-8")
    with pytest.raises(VerifyUsageError, match="defines no build"):
        compare(snippet / "original", snippet / "migrated", tmp_path / "nobuild.py")
    (tmp_path / "raises.py").write_text("def build():\n    raise ValueError('no weights here')\n", encoding="utf-8")
    with pytest.raises(VerifyUsageError) as caught:
        compare(snippet / "original", snippet / "migrated", tmp_path / "raises.py")
    assert f"{tmp_path / 'raises.py'}:2: ValueError: no weights here (build(), in the original tree)" == str(
        caught.value
    )
    assert "Traceback" in caught.value.detail


# -- the command ------------------------------------------------------------------------------------------


def _cli(*args: str):
    app = typer.Typer()
    app.command("verify")(verify_command)
    app.command("other")(lambda: None)  # two commands, so `verify` is a subcommand as in npu-migrate
    return CliRunner().invoke(app, ["verify", *args])


def test_cli_pass_fail_and_usage_exit_codes(snippet, tmp_path):
    common = ["--original", str(snippet / "original"), "--factory", str(snippet / "factory.py")]
    ok = _cli(*common, "--migrated", str(snippet / "migrated"), "--min-cosine", "0.999", "--seed", "3")
    assert ok.exit_code == 0, ok.output
    assert "reference mode" in ok.output and "npu_fusion_attention x2" in ok.output and "result: PASS" in ok.output

    broken = _variant(snippet, tmp_path, ", scale=1.0 / math.sqrt(q.shape[-1])", "")
    failed = _cli(*common, "--migrated", str(broken), "--format", "json")
    assert failed.exit_code == 1, failed.output
    data = json.loads(failed.output)
    assert data["passed"] is False and data["mode"] == "reference" and data["dtype"] == "float32"
    assert data["fused_calls"] == {"npu_fusion_attention": 2, "npu_rotary_mul": 4}
    assert {o["name"]: o["passed"] for o in data["outputs"]} == {"output[0]": False, "output[1]": False}

    (tmp_path / "raises.py").write_text("def build():\n    raise ValueError('no weights here')\n", encoding="utf-8")
    usage = [
        "--original",
        str(snippet / "original"),
        "--migrated",
        str(snippet / "migrated"),
        "--factory",
        str(tmp_path / "raises.py"),
    ]
    error = _cli(*usage)
    assert error.exit_code == 2
    assert "raises.py:2: ValueError: no weights here" in error.output and "Traceback" not in error.output
    verbose = _cli(*usage, "--verbose")
    assert verbose.exit_code == 2 and "Traceback" in verbose.output
    assert _cli("--original", "x").exit_code == 2  # missing required options
