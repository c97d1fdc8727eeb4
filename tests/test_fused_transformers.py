"""NPU701-NPU704 on the real transformers modeling files, end to end.

The six decoder models and `integrations/sdpa_attention.py` are migrated into a copy of the installed
transformers package (symlinks for everything else), and tiny random models are built from the original
and the migrated package in subprocesses with the same seed, twice: fp32 with eager attention, and fp16
with SDPA attention on an unpadded batch (SDPA's is_causal, GQA through enable_gqa) and a left-padded
one (a bool mask with fully masked rows, kv heads repeated). Off an NPU the logits must be
bit-identical. The migrated files import their helpers from the package's helper module
(`transformers/_npu_fused.py`), written as `apply` writes it. Then the fused branches are forced on (the
module's `_is_npu` true) with the CPU reference kernels of `npu_migrate.verify.reference` as its `torch_npu`,
before any migrated module imports from it: the logits must still match, the kernels must be called
as often as the model has norms, MLPs, rotary embeddings and attention layers, and Gemma's GELU MLP
must keep its original code.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from npu_migrate.engine.pipeline import helper_imports, migrate_text
from npu_migrate.output.helper_module import changes
from npu_migrate.program.packages import collect, helper_module

pytestmark = pytest.mark.integration  # needs torch (and transformers): the `integration` extra

MODELS = ("llama", "qwen2", "qwen3", "mistral", "gemma", "phi3")
LAYERS = 2
#: Sites per modeling file: one RMSNorm class, one MLP class, one `apply_rotary_pos_emb` each (Phi-3's
#: is partial rotary). Attention runs through `ALL_ATTENTION_FUNCTIONS`: the modeling files only hold
#: `eager_attention_forward`, which returns the probabilities and is reported (NPU704, open).
EXPECTED_SITES = {name: {"NPU701": 1, "NPU702": 1, "NPU703": 1} for name in MODELS}
EXPECTED_OPEN = {name: {"NPU704": 1} for name in MODELS}
#: The one SDPA call of `sdpa_attention_forward`, wrapped by the opt-in NPU707 (selected for this file only:
#: by default NPU704 leaves it native, `test_the_sdpa_integration_is_left_native_by_default`).
INTEGRATION_SITES = {"NPU707": 1}
INTEGRATION_SELECT = ["ALL", "NPU707"]


def _per_forward(name: str, attention: bool) -> dict[str, int]:
    """Kernel calls in one forward pass: two norms per layer and the final norm (Qwen3 adds q/k norms);
    one SwiGLU per layer, none for Gemma, whose MLP is GELU (`_is_silu` declines it at run time); q and
    k rotated per layer; one attention per layer when SDPA runs through the kernel."""
    return {
        "npu_rms_norm": 2 * LAYERS + 1 + (2 * LAYERS if name == "qwen3" else 0),
        "npu_swiglu": 0 if name == "gemma" else LAYERS,
        "npu_rotary_mul": 2 * LAYERS,
        "npu_fusion_attention": LAYERS if attention else 0,
    }


#: fp32 eager: one forward. fp16 SDPA: an unpadded and a left-padded forward.
EXPECTED_CALLS = {
    "eager": {name: _per_forward(name, False) for name in MODELS},
    "sdpa": {name: {k: 2 * v for k, v in _per_forward(name, True).items()} for name in MODELS},
}
#: How the SDPA forwards reach the kernel: unpadded, HF passes no mask and is_causal with enable_gqa;
#: padded, a bool mask and kv heads repeated.
EXPECTED_ATTENTION_KINDS = {"mask": LAYERS, "causal": LAYERS, "full": 0, "gqa": LAYERS}
ZERO_CALLS = {"npu_rms_norm": 0, "npu_swiglu": 0, "npu_rotary_mul": 0, "npu_fusion_attention": 0}

RUNNER = textwrap.dedent("""
    import importlib, json, sys
    import torch

    mode, attention, dtype = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3])
    force = mode == "force"
    import transformers
    from npu_migrate.verify.reference import torch_npu_module

    fake = torch_npu_module()
    calls, attention_kinds = fake.calls, fake.kinds["npu_fusion_attention"]
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=%(layers)d, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=128, pad_token_id=0)
    # Phi-3 rotates only part of each head: the branch must slice as the original does.
    extra = {"phi3": {"partial_rotary_factor": 0.5}}
    out = {"transformers": transformers.__file__, "models": {}}
    if force:
        helpers = importlib.import_module("transformers._npu_fused")
        helpers._is_npu = lambda x: True
        helpers.torch_npu = fake
    sdpa = importlib.import_module("transformers.integrations.sdpa_attention")
    ids = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    padded = torch.ones(2, 7, dtype=torch.long)
    padded[1, :3] = 0
    batches = [{}] if attention == "eager" else [{}, {"attention_mask": padded}]
    for name, prefix in %(models)r:
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        config = getattr(transformers, prefix + "Config")(**common, **extra.get(name, {}))
        config._attn_implementation = attention
        torch.manual_seed(0)
        model = getattr(module, prefix + "ForCausalLM")(config).eval().to(dtype)
        before, kinds = dict(calls), dict(attention_kinds)
        logits = []
        with torch.no_grad():
            for batch in batches:
                logits += model(ids, **batch).logits.float().flatten().tolist()
        out["models"][name] = {
            "logits": logits,
            "calls": {k: calls[k] - before.get(k, 0) for k in %(ops)r},
            "attention_kinds": {k: attention_kinds[k] - kinds.get(k, 0) for k in %(kinds)r},
            "fused_defined": hasattr(module, "_is_npu"),
            "sdpa_fused_defined": hasattr(sdpa, "_npu_sdpa"),
        }
    print(json.dumps(out))
""") % {
    "layers": LAYERS,
    "ops": list(ZERO_CALLS),
    "kinds": list(EXPECTED_ATTENTION_KINDS),
    "models": [
        (m, p)
        for m, p in (
            ("llama", "Llama"),
            ("qwen2", "Qwen2"),
            ("qwen3", "Qwen3"),
            ("mistral", "Mistral"),
            ("gemma", "Gemma"),
            ("phi3", "Phi3"),
        )
    ],
}


def _package_root() -> Path:
    return Path(importlib.util.find_spec("transformers").submodule_search_locations[0])


INTEGRATION = "integrations/sdpa_attention.py"


def _mirror(original: Path, copy: Path, keep: set[str]) -> None:
    """`copy` as a folder of symlinks to `original`'s entries, except the names in `keep`."""
    copy.mkdir()
    for entry in original.iterdir():
        if entry.name not in keep and entry.name != "__pycache__":
            (copy / entry.name).symlink_to(entry)


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    """A transformers package whose six modeling files and SDPA integration are migrated, with its helper
    module; the findings per file (keyed by model name, and by INTEGRATION), and the module's text."""
    root = tmp_path_factory.mktemp("site")
    original = _package_root()
    package = root / "transformers"
    _mirror(original, package, {"models", "integrations"})
    _mirror(original / "models", package / "models", set(MODELS))
    _mirror(original / "integrations", package / "integrations", {"sdpa_attention.py"})
    targets = {name: f"models/{name}/modeling_{name}.py" for name in MODELS} | {INTEGRATION: INTEGRATION}
    for name in MODELS:
        _mirror(original / "models" / name, package / "models" / name, {f"modeling_{name}.py"})
    findings, imports = {}, {}
    for key, relative in targets.items():
        source = (original / relative).read_text(encoding="utf-8")
        module = helper_module(package / relative)
        select = INTEGRATION_SELECT if key == INTEGRATION else None
        text, found = migrate_text(source, path=Path(relative).name, helper_module=module, select=select)
        (package / relative).write_text(text, encoding="utf-8")
        findings[key] = (source, text, found, module)
        collect(imports, package / relative, *helper_imports(text, None, module))
    (change,) = changes(imports)  # one module, at transformers/: the files' `from ...utils import` prove it
    assert change.path == package / "_npu_fused.py"
    change.path.write_text(change.after, encoding="utf-8")
    return root, findings, change.after


def _run(site: Path | None, mode: str, attention: str, dtype: str) -> dict:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    path = [str(site)] if site else []
    code = f"import sys; sys.path[:0] = {path!r}; exec(sys.stdin.read())"
    done = subprocess.run(
        [sys.executable, "-c", code, mode, attention, dtype],
        input=RUNNER,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


#: Per attention implementation: its dtype, and the tolerance of the forced run against the original
#: (fp16: the reference kernels accumulate in fp32, CPU SDPA differs by an ulp or two, ~1e-3 seen).
SETUPS = {"eager": ("float32", 1e-5), "sdpa": ("float16", 4e-3)}


@pytest.fixture(scope="module")
def runs(migrated):
    site, *_ = migrated
    return {
        attention: (
            _run(None, "plain", attention, dtype),
            _run(site, "plain", attention, dtype),
            _run(site, "force", attention, dtype),
        )
        for attention, (dtype, _) in SETUPS.items()
    }


def _tally(found, fixed: bool) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in found:
        if f.fixed == fixed and "helpers" not in f.message:
            counts[f.rule_id] = counts.get(f.rule_id, 0) + 1
    return counts


@pytest.mark.parametrize("name", [*MODELS, INTEGRATION])
def test_expected_sites_get_a_fused_branch(migrated, name):
    _, findings, helpers = migrated
    source, text, found, module = findings[name]
    if name == INTEGRATION:
        assert _tally(found, True) == INTEGRATION_SITES
        assert text.count("_npu_sdpa(\n        query,") == 1
        assert "\nfrom .._npu_fused import _npu_sdpa\n" in text
    else:
        assert _tally(found, True) == EXPECTED_SITES[name]
        assert _tally(found, False) == EXPECTED_OPEN[name]
        assert module == "..._npu_fused"
        swiglu = "_npu_swiglu_halves" if name == "phi3" else "_npu_silu_mul"  # Phi-3 projects gate and up at once
        names = f"_is_npu, _is_silu, _npu_rms_norm, _npu_rotary_fits, _npu_rotary_mul, {swiglu}"
        assert f"\nfrom ..._npu_fused import {names}\n" in text
        assert text.count("_npu_rms_norm(") == 1 and text.count(f"{swiglu}(") == 1
        assert text.count("_npu_rotary_mul(") == 2  # q and k
    assert "def _is_npu(" not in text and "\nimport torch_npu\n" not in text
    # The helpers, each once, in the one module; it reaches torch_npu only through its guarded import.
    for helper in ("_is_npu", "_is_silu", "_npu_rms_norm", "_npu_rotary_fits", "_npu_rotary_mul", "_npu_sdpa"):
        assert helpers.count(f"def {helper}(") == 1
    assert helpers.count("import torch_npu") == 1 and "\nimport torch_npu\n" not in helpers
    removed = [line for line in _diff(source, text) if line.startswith("-")]
    if name == INTEGRATION:
        # The one edit besides insertions: the SDPA call gets the wrapper, its arguments untouched.
        assert removed == ["-     attn_output = torch.nn.functional.scaled_dot_product_attention("]
    else:
        # Every original line survives, in order: the branches and the prelude are insertions only.
        assert removed == []
    select = INTEGRATION_SELECT if name == INTEGRATION else None
    again, refound = migrate_text(text, path=Path(name).name, helper_module=module, select=select)
    assert again == text and not any(f.fixed for f in refound)


def test_the_sdpa_integration_is_left_native_by_default():
    """torch_npu runs SDPA as its fused kernel on Atlas A2 / A3: by default the call stays, reported once."""
    source = (_package_root() / INTEGRATION).read_text(encoding="utf-8")
    text, found = migrate_text(source, path=Path(INTEGRATION).name, helper_module="..._npu_fused")
    assert text == source
    assert [(f.rule_id, f.fixed) for f in found] == [("NPU704", False)]
    assert "left as it is" in found[0].message and "NPU707" in found[0].message


def _diff(a: str, b: str) -> list[str]:
    import difflib

    return [line for line in difflib.ndiff(a.splitlines(), b.splitlines()) if line[:1] in "+-"]


def test_migrated_package_is_the_one_imported(runs, migrated):
    site, *_ = migrated
    for original, plain, _ in runs.values():
        assert original["transformers"].startswith(str(_package_root()))
        assert plain["transformers"].startswith(str(site))
        assert all(m["fused_defined"] and m["sdpa_fused_defined"] for m in plain["models"].values())
        assert not any(m["fused_defined"] or m["sdpa_fused_defined"] for m in original["models"].values())


@pytest.mark.parametrize("attention", sorted(SETUPS))
@pytest.mark.parametrize("name", MODELS)
def test_off_npu_logits_are_bit_identical(runs, name, attention):
    original, plain, _ = runs[attention]
    assert plain["models"][name]["logits"] == original["models"][name]["logits"]
    assert plain["models"][name]["calls"] == ZERO_CALLS


@pytest.mark.parametrize("attention", sorted(SETUPS))
@pytest.mark.parametrize("name", MODELS)
def test_forced_fused_branches_compute_the_same_model(runs, name, attention):
    import torch

    original, _, forced = runs[attention]
    assert forced["models"][name]["calls"] == EXPECTED_CALLS[attention][name]
    if attention == "sdpa":
        assert forced["models"][name]["attention_kinds"] == EXPECTED_ATTENTION_KINDS
    expected = torch.tensor(original["models"][name]["logits"])
    got = torch.tensor(forced["models"][name]["logits"])
    tolerance = SETUPS[attention][1]
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)


# -- hand-written attention in a real model: MegatronBERT's self-attention (a float padding mask of 0 and
# the dtype's lowest, an `output_attentions` parameter) ------------------------------------------------


def _migrated_module(name: str, tmp_path: Path):
    """transformers' `modeling_<name>.py` migrated, imported inside the package (its relative imports)."""
    original = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    text, found = migrate_text(Path(original.__file__).read_text(encoding="utf-8"), path=f"modeling_{name}.py")
    path = tmp_path / f"modeling_{name}.py"
    path.write_text(text, encoding="utf-8")
    qualified = f"transformers.models.{name}._npu_migrated"
    spec = importlib.util.spec_from_file_location(qualified, path, submodule_search_locations=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = f"transformers.models.{name}"
    sys.modules[qualified] = module
    spec.loader.exec_module(module)
    return original, module, found


@pytest.mark.parametrize("dtype, floor", [("float16", 0.999), ("bfloat16", 0.99)])
def test_megatron_bert_eager_attention_is_fused(tmp_path, monkeypatch, dtype, floor):
    import torch
    from transformers import MegatronBertConfig

    from npu_migrate.verify.reference import torch_npu_module

    original, migrated, found = _migrated_module("megatron_bert", tmp_path)
    assert [f.line for f in found if f.rule_id == "NPU704" and f.fixed and "helpers" not in f.message] == [126]
    config = MegatronBertConfig(
        vocab_size=99, hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4, intermediate_size=96
    )
    config._attn_implementation = "eager"
    ids = torch.randint(1, 99, (2, 7), generator=torch.Generator().manual_seed(1))
    padding = torch.ones(2, 7, dtype=torch.long)
    padding[1, 5:] = 0

    def run(module):
        torch.manual_seed(0)
        model = module.MegatronBertModel(config).eval().to(getattr(torch, dtype))
        with torch.no_grad():
            return model(ids, attention_mask=padding).last_hidden_state

    expected = run(original)
    assert torch.equal(run(migrated), expected), "off an NPU the migrated model gives the same bits"
    fake = torch_npu_module()
    monkeypatch.setattr(migrated, "_is_npu", lambda x: True)
    monkeypatch.setattr(migrated, "torch_npu", fake)
    got = run(migrated)
    assert fake.calls["npu_fusion_attention"] == LAYERS
    cosine = torch.nn.functional.cosine_similarity(got.double().flatten(), expected.double().flatten(), dim=0)
    assert cosine.item() >= floor
